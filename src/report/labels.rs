//! Allocation sites and scope paths, worked out once per stack and per scope rather than once
//! per block: a file may name one long stack or scope from a million blocks, and the reports
//! must stay linear in the file's size.

use super::{printable, site_frame, site_label};
use crate::intern::Interner;
use crate::record::Frame;
use crate::snapshot::{ContextInfo, Snapshot};

const UNSEEN: u32 = u32::MAX;

/// Small ids for the distinct sites (by label) and scope paths of one snapshot. Site 0 is
/// `<no stack>` and scope 0 the empty path.
pub(crate) struct Labels<'a> {
    snap: &'a Snapshot,
    site_of_stack: Vec<u32>,
    scope_of_index: Vec<u32>,
    /// Per site id (by label): its label and its frame (`None` for `<no stack>`).
    sites: Interner<String, (String, Option<&'a Frame>)>,
    scopes: Interner<String>,
}

impl<'a> Labels<'a> {
    pub(crate) fn new(snap: &'a Snapshot) -> Self {
        Labels {
            snap,
            site_of_stack: vec![UNSEEN; snap.stacks.len()],
            scope_of_index: vec![UNSEEN; snap.scopes.len()],
            sites: {
                let mut sites = Interner::default();
                sites.id(site_label(None), |label| (label.clone(), None));
                sites
            },
            scopes: Interner::from_items(vec![String::new()]),
        }
    }

    /// The site of a context: its stack's innermost frame of the program itself.
    pub(crate) fn site(&mut self, ctx: Option<&ContextInfo>) -> u32 {
        let Some(stack) = ctx.and_then(|c| c.stack) else { return 0 };
        let Some(&known) = self.site_of_stack.get(stack.index()) else { return 0 };
        if known != UNSEEN {
            return known;
        }
        let frame = site_frame(self.snap, ctx);
        let id = self.sites.id(printable(&site_label(frame)).into_owned(), |label| (label.clone(), frame));
        self.site_of_stack[stack.index()] = id;
        id
    }

    /// The scope path of a context, `a/b`.
    pub(crate) fn scope(&mut self, ctx: Option<&ContextInfo>) -> u32 {
        let Some(index) = ctx.map(|c| c.scope) else { return 0 };
        let Some(&known) = self.scope_of_index.get(index.index()) else { return 0 };
        if known != UNSEEN {
            return known;
        }
        let id = self.scopes.intern(printable(&self.snap.scope_path(ctx)).into_owned());
        self.scope_of_index[index.index()] = id;
        id
    }

    pub(crate) fn site_label(&self, id: u32) -> &str {
        &self.sites.item(id).0
    }

    pub(crate) fn site_frame(&self, id: u32) -> Option<&'a Frame> {
        self.sites.item(id).1
    }

    pub(crate) fn scope_label(&self, id: u32) -> &str {
        self.scopes.item(id)
    }
}
