//! Allocation sites and scope paths, worked out once per stack and per scope rather than once
//! per block: a file may name one long stack or scope from a million blocks, and the reports
//! must stay linear in the file's size.

use super::{site_frame, site_label};
use crate::record::Frame;
use crate::snapshot::{ContextInfo, Snapshot};
use std::collections::HashMap;

const UNSEEN: u32 = u32::MAX;

/// The id of `label` in `ids`, adding `item(label)` to `items` when it is new.
fn intern<T>(ids: &mut HashMap<String, u32>, items: &mut Vec<T>, label: String, item: impl FnOnce(String) -> T) -> u32 {
    let next = items.len() as u32;
    let id = *ids.entry(label.clone()).or_insert(next);
    if id == next {
        items.push(item(label));
    }
    id
}

/// Small ids for the distinct sites (by label) and scope paths of one snapshot. Site 0 is
/// `<no stack>` and scope 0 the empty path.
pub(crate) struct Labels<'a> {
    snap: &'a Snapshot,
    site_of_stack: Vec<u32>,
    scope_of_index: Vec<u32>,
    /// Per site id: its label and its frame (`None` for `<no stack>`).
    sites: Vec<(String, Option<&'a Frame>)>,
    site_ids: HashMap<String, u32>,
    scopes: Vec<String>,
    scope_ids: HashMap<String, u32>,
}

impl<'a> Labels<'a> {
    pub(crate) fn new(snap: &'a Snapshot) -> Self {
        Labels {
            snap,
            site_of_stack: vec![UNSEEN; snap.stacks.len()],
            scope_of_index: vec![UNSEEN; snap.scopes.len()],
            sites: vec![(site_label(None), None)],
            site_ids: HashMap::from([(site_label(None), 0)]),
            scopes: vec![String::new()],
            scope_ids: HashMap::from([(String::new(), 0)]),
        }
    }

    /// The site of a context: its stack's innermost frame of the program itself.
    pub(crate) fn site(&mut self, ctx: Option<&ContextInfo>) -> u32 {
        let Some(stack) = ctx.and_then(|c| c.stack) else { return 0 };
        let Some(&known) = self.site_of_stack.get(stack as usize) else { return 0 };
        if known != UNSEEN {
            return known;
        }
        let frame = site_frame(self.snap, ctx);
        let id = intern(&mut self.site_ids, &mut self.sites, site_label(frame), |label| (label, frame));
        self.site_of_stack[stack as usize] = id;
        id
    }

    /// The scope path of a context, `a/b`.
    pub(crate) fn scope(&mut self, ctx: Option<&ContextInfo>) -> u32 {
        let Some(index) = ctx.map(|c| c.scope) else { return 0 };
        let Some(&known) = self.scope_of_index.get(index as usize) else { return 0 };
        if known != UNSEEN {
            return known;
        }
        let id = intern(&mut self.scope_ids, &mut self.scopes, self.snap.scope_path(ctx), |label| label);
        self.scope_of_index[index as usize] = id;
        id
    }

    pub(crate) fn site_label(&self, id: u32) -> &str {
        &self.sites[id as usize].0
    }

    pub(crate) fn site_frame(&self, id: u32) -> Option<&'a Frame> {
        self.sites[id as usize].1
    }

    pub(crate) fn scope_label(&self, id: u32) -> &str {
        &self.scopes[id as usize]
    }
}
