//! Scopes from `tracing` spans (cargo feature `tracing`).

use super::scope;
use std::cell::RefCell;
use tracing::span;
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A span entered on this thread: its id, its name, and the scope current before it.
struct Entered {
    span: span::Id,
    name: &'static str,
    previous: u32,
}

thread_local! {
    /// Spans entered on this thread, innermost last.
    static ENTERED: RefCell<Vec<Entered>> = const { RefCell::new(Vec::new()) };
}

/// A `tracing-subscriber` layer that makes every entered span a vramscope scope, named after
/// the span, so code already annotated with `tracing` gets scopes without guards.
///
/// Exits are matched to their span: when a span exits while spans entered after it are still
/// entered (`a` entered, `b` entered, `a` exits), the scope becomes the one `a` was entered
/// from with the remaining spans inside it (`b`), rather than whatever was current before the
/// innermost one.
///
/// ```
/// use tracing_subscriber::prelude::*;
/// let subscriber = tracing_subscriber::registry().with(vramscope::record::ScopeLayer::default());
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
            let previous = scope::current_id();
            let name = span.name();
            scope::restore(scope::child(previous, name));
            ENTERED.with(|e| e.borrow_mut().push(Entered { span: id.clone(), name, previous }));
        }
    }

    fn on_exit(&self, id: &span::Id, _ctx: Context<'_, S>) {
        ENTERED.with(|e| {
            let mut entered = e.borrow_mut();
            let Some(k) = entered.iter().rposition(|x| x.span == *id) else { return };
            let gone = entered.remove(k);
            // Rebuild the spans entered after it on top of the scope it was entered from.
            let mut current = gone.previous;
            for later in &mut entered[k..] {
                later.previous = current;
                current = scope::child(current, later.name);
            }
            scope::restore(current);
        });
    }
}
