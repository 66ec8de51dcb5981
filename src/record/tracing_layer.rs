//! Scopes from `tracing` spans (cargo feature `tracing`).

use super::scope;
use std::cell::RefCell;
use tracing::span;
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

thread_local! {
    /// The scope that was current before each entered span, innermost last.
    static ENTERED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// A `tracing-subscriber` layer that makes every entered span a vramscope scope, named after
/// the span, so code already annotated with `tracing` gets scopes without guards.
///
/// ```
/// use tracing_subscriber::prelude::*;
/// let subscriber = tracing_subscriber::registry().with(vramscope::ScopeLayer::default());
/// tracing::subscriber::with_default(subscriber, || {
///     let _span = tracing::info_span!("forward").entered();
///     assert_eq!(vramscope::current_scope().path(), ["forward"]);
/// });
/// ```
#[derive(Debug, Default, Clone, Copy)]
#[non_exhaustive]
pub struct ScopeLayer;

impl<S> Layer<S> for ScopeLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let previous = scope::enter_named(span.name());
            ENTERED.with(|e| e.borrow_mut().push(previous));
        }
    }

    fn on_exit(&self, id: &span::Id, ctx: Context<'_, S>) {
        if ctx.span(id).is_some() {
            if let Some(previous) = ENTERED.with(|e| e.borrow_mut().pop()) {
                scope::restore(previous);
            }
        }
    }
}
