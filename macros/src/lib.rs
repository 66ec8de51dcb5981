//! `#[gpu_mem_test]`: see the `vramscope` crate's documentation; use it as
//! `vramscope::gpu_mem_test`.

#![warn(missing_docs)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ItemFn, Lit, MetaNameValue, ReturnType, Token};

const KEYS: &str = "iters, warmup, tolerance, metric, device, backend, source, snapshot";

/// Runs a test body for warm-up plus measured iterations and fails, naming the allocation sites
/// that kept memory alive, when live memory grows. Keys (all optional): `iters = 5`,
/// `warmup = 1`, `tolerance = "0 B"` (bytes: a number, or a text read at compile time by
/// `vramscope::config::parse_byte_size`, e.g. `"64 KiB"`), `metric = "live_bytes" | "live_blocks" | "reserved_bytes" | "device_bytes"`,
/// `device = 0`, `backend = "any" | "host" | "cuda"`, `source = "vramscope" | "cuda"` (with
/// `"cuda"`, every CUDA allocation of the process counts: cudarc, candle, cuBLAS; needs
/// vramscope's `cupti` feature), `snapshot = false`.
#[proc_macro_attribute]
pub fn gpu_mem_test(args: TokenStream, item: TokenStream) -> TokenStream {
    match expand(args.into(), item.into()) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

struct Options {
    iters: u64,
    warmup: u64,
    /// Where an iteration count out of range is reported: the `iters` value, else `warmup`'s.
    iterations_span: Span,
    tolerance: TokenStream2,
    metric: &'static str,
    device: u64,
    backend: &'static str,
    source: &'static str,
    snapshot: bool,
}

fn lit(nv: &MetaNameValue) -> Option<&Lit> {
    match &nv.value {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit),
        _ => None,
    }
}

fn int(nv: &MetaNameValue, key: &str) -> syn::Result<u64> {
    let err = || syn::Error::new_spanned(&nv.value, format!("`{key}` takes a whole number, e.g. `{key} = 5`"));
    match lit(nv) {
        Some(Lit::Int(i)) => i.base10_parse::<u64>().map_err(|_| err()),
        _ => Err(err()),
    }
}

fn one_of(nv: &MetaNameValue, key: &str, accepted: &[&'static str]) -> syn::Result<&'static str> {
    if let Some(Lit::Str(s)) = lit(nv) {
        if let Some(v) = accepted.iter().find(|a| **a == s.value()) {
            return Ok(v);
        }
    }
    let list = accepted.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ");
    Err(syn::Error::new_spanned(&nv.value, format!("`{key}` takes one of {list}")))
}

/// The tolerance: a whole number of bytes, or a text that vramscope's byte-size parser (a
/// `const fn`, the one behind `VRAMSCOPE_CAPACITY` and the command line) reads at compile
/// time: `"0 B"`, `"4 KiB"`, `"1.5MiB"`, `"2 GB"`. A text it refuses fails the build there,
/// with its message, at the text.
fn bytes(nv: &MetaNameValue) -> syn::Result<TokenStream2> {
    match lit(nv) {
        Some(Lit::Int(i)) => {
            let n = i.base10_parse::<u64>()?;
            Ok(quote!(#n))
        }
        Some(Lit::Str(s)) => Ok(quote_spanned! {s.span()=> {
            const TOLERANCE: u64 = match ::vramscope::__macro_support::parse_byte_size(#s) {
                ::core::result::Result::Ok(bytes) => bytes,
                ::core::result::Result::Err(e) => ::core::panic!("{}", e.message()),
            };
            TOLERANCE
        }}),
        _ => Err(syn::Error::new_spanned(
            &nv.value,
            "`tolerance` takes bytes with a unit, e.g. `tolerance = \"64 KiB\"`, or a whole number",
        )),
    }
}

fn parse_options(args: TokenStream2) -> syn::Result<Options> {
    let mut o = Options {
        iters: 5,
        warmup: 1,
        iterations_span: Span::call_site(),
        tolerance: quote!(0u64),
        metric: "LiveBytes",
        device: 0,
        backend: "Any",
        source: "Vramscope",
        snapshot: false,
    };
    let list = Punctuated::<MetaNameValue, Token![,]>::parse_terminated.parse2(args).map_err(|e| {
        syn::Error::new(e.span(), format!("expected `key = value` pairs separated by commas; accepted keys: {KEYS}"))
    })?;
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let mut seen: Vec<String> = Vec::new();
    for nv in &list {
        let key = nv.path.get_ident().map(ToString::to_string).unwrap_or_default();
        if !key.is_empty() && seen.contains(&key) {
            push(syn::Error::new_spanned(&nv.path, format!("`{key}` is given twice; give each key once")));
            continue;
        }
        seen.push(key.clone());
        let r: syn::Result<()> = (|| {
            match key.as_str() {
                // The range (at least one measured, at most `vramscope::testing::MAX_ITERATIONS`
                // in all) is checked by vramscope itself, in a constant of the expansion.
                "iters" => {
                    o.iters = int(nv, "iters")?;
                    o.iterations_span = syn::spanned::Spanned::span(&nv.value);
                }
                "warmup" => {
                    o.warmup = int(nv, "warmup")?;
                    if !seen.iter().any(|k| k == "iters") {
                        o.iterations_span = syn::spanned::Spanned::span(&nv.value);
                    }
                }
                "device" => o.device = int(nv, "device")?,
                "tolerance" => o.tolerance = bytes(nv)?,
                "metric" => {
                    o.metric =
                        match one_of(nv, "metric", &["live_bytes", "live_blocks", "reserved_bytes", "device_bytes"])? {
                            "live_bytes" => "LiveBytes",
                            "live_blocks" => "LiveBlocks",
                            "device_bytes" => "DeviceBytes",
                            _ => "ReservedBytes",
                        }
                }
                "backend" => {
                    o.backend = match one_of(nv, "backend", &["any", "host", "cuda"])? {
                        "any" => "Any",
                        "host" => "Host",
                        _ => "Cuda",
                    }
                }
                "source" => {
                    o.source = match one_of(nv, "source", &["vramscope", "cuda"])? {
                        "vramscope" => "Vramscope",
                        _ => "Cuda",
                    }
                }
                "snapshot" => {
                    o.snapshot = match lit(nv) {
                        Some(Lit::Bool(b)) => b.value,
                        _ => return Err(syn::Error::new_spanned(&nv.value, "`snapshot` takes `true` or `false`")),
                    }
                }
                _ => {
                    let path = &nv.path;
                    let shown = if key.is_empty() { quote!(#path).to_string() } else { key.clone() };
                    return Err(syn::Error::new_spanned(path, format!("unknown key `{shown}`; accepted keys: {KEYS}")));
                }
            }
            Ok(())
        })();
        if let Err(e) = r {
            push(e);
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(o),
    }
}

/// Whether an attribute is a test attribute (`#[test]`, `#[tokio::test]`, `#[rstest]`...).
fn is_test_attr(attr: &syn::Attribute) -> bool {
    attr.path().segments.last().is_some_and(|s| s.ident == "test" || s.ident == "rstest")
}

fn expand(args: TokenStream2, item: TokenStream2) -> syn::Result<TokenStream2> {
    let o = parse_options(args)?;
    let f: ItemFn = syn::parse2(item).map_err(|e| {
        syn::Error::new(e.span(), "#[gpu_mem_test] goes on a test function: `#[gpu_mem_test] fn name() { ... }`")
    })?;
    if f.sig.asyncness.is_some() {
        return Err(syn::Error::new_spanned(
            f.sig.asyncness,
            "#[gpu_mem_test] runs the body several times and needs a synchronous function: put \
             #[tokio::test] (or your runtime's test attribute) above #[gpu_mem_test], so that it \
             expands first",
        ));
    }
    if !f.sig.inputs.is_empty() {
        return Err(syn::Error::new_spanned(&f.sig.inputs, "#[gpu_mem_test] functions take no arguments"));
    }
    let has_test = f.attrs.iter().any(is_test_attr);
    let test_attr = if has_test { quote!() } else { quote!(#[::core::prelude::v1::test]) };
    let attrs = &f.attrs;
    let vis = &f.vis;
    let sig = &f.sig;
    let name = &f.sig.ident;
    let block = &f.block;
    let closure = match &f.sig.output {
        ReturnType::Default => quote!(|| #block),
        ReturnType::Type(_, ty) => quote!(|| -> #ty #block),
    };
    let (tolerance, device) = (&o.tolerance, o.device as usize);
    let (iters, warmup) = (o.iters, o.warmup);
    // At module level, so that a refused tolerance fails every build, not only `cargo test`
    // (test functions are left out of other builds before constants are evaluated).
    // A raw identifier (`fn r#match`) names the test by its bare name.
    let bare = name.unraw();
    let tolerance_const = syn::Ident::new(&format!("__VRAMSCOPE_TOLERANCE_{bare}"), Span::call_site());
    let iterations_const = syn::Ident::new(&format!("__VRAMSCOPE_ITERATIONS_{bare}"), Span::call_site());
    let iterations = quote_spanned! {o.iterations_span=>
        match ::vramscope::__macro_support::checked_iterations(#warmup, #iters) {
            ::core::result::Result::Ok(n) => n,
            ::core::result::Result::Err(e) => ::core::panic!("{}", e),
        }
    };
    let metric = syn::Ident::new(o.metric, Span::call_site());
    let backend = syn::Ident::new(o.backend, Span::call_site());
    let source = syn::Ident::new(o.source, Span::call_site());
    let snapshot = if o.snapshot {
        quote!(::vramscope::__macro_support::insta::assert_snapshot!(__vramscope_test.scope_report());)
    } else {
        quote!()
    };
    Ok(quote! {
        #[doc(hidden)]
        #[allow(dead_code, non_upper_case_globals)]
        const #tolerance_const: u64 = #tolerance;
        #[doc(hidden)]
        #[allow(dead_code, non_upper_case_globals)]
        const #iterations_const: usize = #iterations;
        #(#attrs)*
        #test_attr
        #vis #sig {
            let __vramscope_test = ::vramscope::testing::MemTest::new(::core::concat!(::core::module_path!(), "::", ::core::stringify!(#bare)))
                .iters(#iterations_const - #warmup as usize)
                .warmup(#warmup as usize)
                .tolerance(#tolerance_const)
                .metric(::vramscope::testing::Metric::#metric)
                .device(#device)
                .backend(::vramscope::testing::BackendRequirement::#backend)
                .source(::vramscope::testing::Source::#source);
            let __vramscope_out = __vramscope_test.run_test(#closure);
            #snapshot
            __vramscope_out
        }
    })
}
