//! Site lines that fit a terminal: `file:line (function)` with the function's middle left out
//! when the whole would be wider than the reader's columns.
//!
//! The file and line say what to fix, so they always stay whole. The function is context, and
//! its ends carry it: the first path segment is the crate (or the test binary, which names the
//! test), the last is the function itself with any closures inside it. What goes is the module
//! path between them, then, if that is not enough, the middle of the function's own name. A
//! line stays one line: readers (and scripts) take `file:line (function)` as one site.

use std::borrow::Cow;

/// What stands for what was left out.
const ELIDED: &str = "..";

/// The columns of the terminal the reports are written for: a line, its indent counted, fits
/// them where its site allows.
pub(crate) const COLUMNS: usize = 100;

/// `site` made to fit `width` columns where it is `file:line (function)` and too wide;
/// anything else (a label without a line, a file alone wider than `width`) as it is.
pub(crate) fn fit_site(site: &str, width: usize) -> Cow<'_, str> {
    if site.chars().count() <= width {
        return Cow::Borrowed(site);
    }
    let Some((place, function)) = split_site(site) else {
        // A function alone (a build without line tables, a C++ frame of PyTorch's): only a
        // C++ parameter list goes, the name stays whole.
        return match without_parameters(site) {
            Some(short) => Cow::Owned(short),
            None => Cow::Borrowed(site),
        };
    };
    let short = without_parameters(function);
    let function = short.as_deref().unwrap_or(function);
    if place.chars().count() + function.chars().count() + 3 <= width {
        return Cow::Owned(format!("{place} ({function})"));
    }
    // `place (` + function + `)`
    let Some(room) = width.checked_sub(place.chars().count() + 3) else { return Cow::Borrowed(site) };
    match shorten(function, room) {
        Some(f) => Cow::Owned(format!("{place} ({f})")),
        None => Cow::Borrowed(site),
    }
}

/// A demangled C++ function (`ns::f(at::Tensor const&, long) const`) with its parameters
/// left out (`ns::f(..) const`): overloads of PyTorch's operators differ in their names
/// (`add_Tensor`, `add_Scalar`), and a parameter list can be hundreds of characters. `None`
/// where `function` has no parameter list (a `(` right after a name, closed at the end or
/// before a trailing ` const`) or it is already empty.
fn without_parameters(function: &str) -> Option<String> {
    let (body, tail) = match function.strip_suffix(" const") {
        Some(body) => (body, " const"),
        None => (function, ""),
    };
    if !body.ends_with(')') {
        return None;
    }
    // The `(` that the last `)` closes.
    let mut depth = 0i32;
    let open = body.char_indices().rev().find_map(|(i, c)| {
        match c {
            ')' => depth += 1,
            '(' => depth -= 1,
            _ => {}
        }
        (depth == 0).then_some(i)
    })?;
    let named = body[..open].chars().next_back().is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '>'));
    let params = &body[open + 1..body.len() - 1];
    (named && !params.is_empty() && params != ELIDED).then(|| format!("{}({ELIDED}){tail}", &body[..open]))
}

/// `("file:line", "function")` of `file:line (function)`.
fn split_site(site: &str) -> Option<(&str, &str)> {
    let inner = site.strip_suffix(')')?;
    let open = inner.find(" (")?;
    let (place, function) = (&inner[..open], &inner[open + 2..]);
    let (_, line) = place.rsplit_once(':')?;
    (!line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) && !function.is_empty()).then_some((place, function))
}

/// `function` in at most `room` characters: its first segment, `..`, and as many of its last
/// segments as fit (a closure's `{{closure}}` stays with the function it is in); failing that,
/// the middle of the whole left out. `None` where `room` is too small to say anything.
fn shorten(function: &str, room: usize) -> Option<String> {
    const LEAST: usize = 2 * ELIDED.len() + 8;
    if room < LEAST {
        return None;
    }
    let units = units(function);
    if units.len() > 2 {
        // As many trailing units as fit, leaving out at least one in the middle.
        for k in (1..units.len() - 1).rev() {
            let text = format!("{}::{ELIDED}::{}", units[0], units[units.len() - k..].join("::"));
            if text.chars().count() <= room {
                return Some(text);
            }
        }
    }
    // Still too wide: the first unit and the closures the last ends in stay whole, and the
    // middle of the last's name goes.
    if let [first, .., last] = units[..] {
        let core = closures_removed(last);
        let suffix = &last[core.len()..];
        let prefix = if units.len() > 2 { format!("{first}::{ELIDED}::") } else { format!("{first}::") };
        let left = room.checked_sub(prefix.chars().count() + suffix.chars().count()).filter(|&r| r >= LEAST);
        if let Some(r) = left {
            return Some(prefix + &middle_out(core, r) + suffix);
        }
    }
    Some(middle_out(function, room))
}

/// `function` without the `::{{closure}}` (or other `::{{...}}`) segments it ends in.
fn closures_removed(function: &str) -> &str {
    let mut core = function;
    while let Some(i) = core.rfind("::{{") {
        if !core.ends_with("}}") {
            break;
        }
        core = &core[..i];
    }
    core
}

/// The top-level `::` segments of a Rust path, closures joined to the segment they are in:
/// `a::b::<T as c::D>::f::{{closure}}` is `a`, `b`, `<T as c::D>`, `f::{{closure}}`.
fn units(function: &str) -> Vec<&str> {
    let mut cuts = vec![0];
    let (bytes, mut depth) = (function.as_bytes(), 0i32);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'<' => depth += 1,
            b'>' if i == 0 || bytes[i - 1] != b'-' => depth -= 1,
            b':' if depth == 0 && bytes.get(i + 1) == Some(&b':') => {
                let rest = &function[i + 2..];
                if !rest.starts_with("{{") {
                    cuts.push(i);
                }
                i += 2;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    cuts.push(function.len());
    cuts.windows(2)
        .map(|w| {
            let s = &function[w[0]..w[1]];
            s.strip_prefix("::").unwrap_or(s)
        })
        .collect()
}

/// `text` in `room` characters: its start and end, `..` between.
fn middle_out(text: &str, room: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= room {
        return text.to_string();
    }
    let keep = room - ELIDED.len();
    let head = keep / 2;
    let tail = keep - head;
    let mut out: String = chars[..head].iter().collect();
    out.push_str(ELIDED);
    out.extend(&chars[chars.len() - tail..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_that_fits_is_left_alone() {
        assert_eq!(fit_site("tests/a.rs:3 (a::f)", 98), "tests/a.rs:3 (a::f)");
        let long = format!("tests/a.rs:3 (a::{})", "m::".repeat(40) + "f");
        assert_eq!(fit_site(&long, 200), long);
    }

    #[test]
    fn the_module_path_goes_first() {
        let site = "tests/zz_show.rs:5 (zz_show::very_long_module_name_for_the_example::inner_mod::\
                    a_function_with_a_rather_long_descriptive_name)";
        let fit = fit_site(site, 85);
        assert_eq!(fit, "tests/zz_show.rs:5 (zz_show::..::a_function_with_a_rather_long_descriptive_name)");
        // As many trailing segments as fit stay.
        let fit = fit_site(site, 98);
        assert_eq!(fit, "tests/zz_show.rs:5 (zz_show::..::inner_mod::a_function_with_a_rather_long_descriptive_name)");
        assert!(fit.chars().count() <= 98);
    }

    #[test]
    fn closures_stay_with_their_function_and_a_long_name_loses_its_middle() {
        let site = "tests/mem_test_alone.rs:17 (mem_test_alone::\
                    growth_from_a_thread_outside_the_scope_is_reported_when_alone::{{closure}}::{{closure}})";
        let fit = fit_site(site, 98);
        assert_eq!(fit.chars().count(), 98, "{fit}");
        assert!(fit.starts_with("tests/mem_test_alone.rs:17 (mem_test_alone::growth_from_"), "{fit}");
        assert!(fit.ends_with("_when_alone::{{closure}}::{{closure}})"), "{fit}");
        assert!(fit.contains("(mem_test_alone::growth_from_..ed_when_alone::{{closure}}"), "{fit}");
        assert_eq!(
            units("a::b::<T as c::D>::f::{{closure}}::{{closure}}"),
            ["a", "b", "<T as c::D>", "f::{{closure}}::{{closure}}"]
        );
        assert_eq!(units("<fn() -> u8 as x::Y>::call"), ["<fn() -> u8 as x::Y>", "call"]);
    }

    #[test]
    fn labels_without_a_line_or_room_stay_whole() {
        let f = format!("{}::f", "m".repeat(120));
        assert_eq!(fit_site(&f, 98), f, "a function alone is all a build without line tables names");
        let wide_file = format!("/{}/a.rs:3 (a::b::c::f)", "d".repeat(120));
        assert_eq!(fit_site(&wide_file, 98), wide_file);
        let odd = format!("{} (not a line)", "x".repeat(100));
        assert_eq!(fit_site(&odd, 98), odd);
    }

    #[test]
    fn a_cpp_function_loses_its_parameters_first() {
        let cudnn = "at::_ops::_cudnn_rnn_backward::call(at::Tensor const&, c10::ArrayRef<at::Tensor>, long, \
                     at::Tensor const&, std::optional<at::Tensor> const&, std::array<bool, 4ul>)";
        assert_eq!(fit_site(cudnn, 78), "at::_ops::_cudnn_rnn_backward::call(..)");
        assert_eq!(fit_site("c10::Foo::get(int, long) const", 20), "c10::Foo::get(..) const");
        assert_eq!(fit_site("f(int)", 6), "f(int)", "it fits");
        let site = format!("aten/src/x.cpp:12 ({cudnn})");
        assert_eq!(fit_site(&site, 98), "aten/src/x.cpp:12 (at::_ops::_cudnn_rnn_backward::call(..))");
        // A name without parameters, or a label with a space before its bracket, stays.
        let f = format!("{}::f()", "m".repeat(120));
        assert_eq!(fit_site(&f, 98), f);
        assert_eq!(without_parameters("x (not a line)"), None);
        assert_eq!(without_parameters("f(g(1), h(2))"), Some("f(..)".to_string()));
        assert_eq!(without_parameters("(a, b)"), None);
    }

    #[test]
    fn never_wider_than_asked() {
        for width in 40..140 {
            let site =
                format!("src/lib.rs:1234 (crate_name::{}::{{{{closure}}}})", "segment_".repeat(9).replace('_', "::s"));
            let fit = fit_site(&site, width);
            assert!(fit.chars().count() <= width || fit == site, "{width}: {fit}");
        }
    }
}
