//! Frames, stacks and scopes as a pickle's reader interns them.

use super::budget::Budget;
use super::{bad, text};
use crate::error::Result;
use crate::intern::Interner;
use crate::model::{FrameId, ScopeId, StackId};
use crate::record::Frame;
use crate::snapshot::pickle::AddressMap;
use crate::snapshot::pickle::{Kept, Memo, Value};

/// Frames, stacks and scopes interned while reading, and what was made of each value the
/// pickle shares, so that a shared frame list, frame or scope string is read once however
/// often it is referenced.
///
/// While the pickle is parsed, what was made of a list or dict goes in its memo slot
/// ([`Kept`]), and the value itself may be freed; after, the tree is whole and values are
/// known by their address ([`Value::identity`]). Each map keeps the value it was made from, so
/// that its address is not reused by another value while the map knows it.
pub(super) struct Tables {
    pub(super) frames: Interner<Frame>,
    pub(super) stacks: Interner<Vec<FrameId>>,
    /// Scope paths from PyTorch's `user_metadata` strings (`a/b`); index 0 is the root.
    pub(super) scopes: Interner<String, Vec<String>>,
    pub(super) stack_of: AddressMap<(Value, Option<StackId>)>,
    pub(super) frame_of: AddressMap<(Value, FrameId)>,
    pub(super) scope_of: AddressMap<(Value, ScopeId)>,
    /// The frames of the stack being read, kept from one stack to the next: a stack met before
    /// is found without a new vector.
    ids: Vec<FrameId>,
}

impl Tables {
    pub(super) fn new() -> Self {
        let mut scopes = Interner::default();
        scopes.id(String::new(), |_| Vec::new());
        Tables {
            frames: Interner::default(),
            stacks: Interner::default(),
            scopes,
            stack_of: AddressMap::default(),
            frame_of: AddressMap::default(),
            scope_of: AddressMap::default(),
            ids: Vec::new(),
        }
    }

    /// The scope of a trace entry's `user_metadata` when it is a string (vramscope writes scope
    /// paths there, `/` between names); the root for an empty, absent or other one.
    pub(super) fn scope(
        &mut self,
        meta: Option<&Value>,
        budget: &mut Budget,
        at: &dyn Fn() -> String,
        source: &str,
    ) -> Result<ScopeId> {
        let Some(v) = meta.filter(|v| v.as_str().is_some_and(|t| !t.is_empty())) else { return Ok(ScopeId::ROOT) };
        let Some(id) = v.identity() else { return Ok(ScopeId::ROOT) };
        if let Some(&(_, scope)) = self.scope_of.get(&id) {
            return Ok(scope);
        }
        budget.spend_bytes(v.byte_len(), at, source)?;
        let text = v.as_str().unwrap_or_default();
        let scope = ScopeId(self.scopes.id(text.to_string(), |text| text.split('/').map(str::to_string).collect()));
        self.scope_of.insert(id, (v.clone(), scope));
        Ok(scope)
    }

    /// The stack of a `frames` list; `None` when it is empty or absent. `memo` is the parser's
    /// while the pickle is being parsed: the list's and each new frame's slots then get what
    /// was made of them.
    pub(super) fn stack(
        &mut self,
        frames: Option<&Value>,
        mut memo: Option<&mut Memo>,
        budget: &mut Budget,
        at: &dyn Fn() -> String,
        source: &str,
    ) -> Result<Option<StackId>> {
        let Some(frames) = frames else { return Ok(None) };
        if let Some(Kept::Stack(known)) = frames.kept() {
            return Ok(known.map(StackId));
        }
        let id = frames.identity();
        if let Some(&(_, known)) = id.and_then(|id| self.stack_of.get(&id)) {
            return Ok(known);
        }
        let stack = match frames.items_ref() {
            Some(list) => self.stack_of_items(&list, memo.as_deref_mut(), budget, at, source)?,
            None => None,
        };
        let kept = memo.is_some_and(|m| m.keep(frames, Kept::Stack(stack.map(|s| s.0))));
        if let (false, Some(id)) = (kept, id) {
            self.stack_of.insert(id, (frames.clone(), stack));
        }
        Ok(stack)
    }

    /// The stack of the frames `items` (a list's items, or those about to be appended to one);
    /// `None` when there are none.
    pub(super) fn stack_of_items(
        &mut self,
        items: &[Value],
        mut memo: Option<&mut Memo>,
        budget: &mut Budget,
        at: &dyn Fn() -> String,
        source: &str,
    ) -> Result<Option<StackId>> {
        budget.spend(items.len(), at, source)?;
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        for (i, f) in items.iter().enumerate() {
            let frame = match f.kept() {
                Some(Kept::Frame(frame)) => FrameId(frame),
                _ => match f.identity().and_then(|id| self.frame_of.get(&id)) {
                    Some(&(_, frame)) => frame,
                    None => {
                        let read = read_frame(f, budget, &|| format!("{}: frame {i}", at()), source)?;
                        let frame = FrameId(self.frames.intern(read));
                        let kept = memo.as_deref_mut().is_some_and(|m| m.keep(f, Kept::Frame(frame.0)));
                        if let (false, Some(id)) = (kept, f.identity()) {
                            self.frame_of.insert(id, (f.clone(), frame));
                        }
                        frame
                    }
                },
            };
            ids.push(frame);
        }
        let stack = (!ids.is_empty()).then(|| StackId(self.stacks.intern_ref(&ids[..])));
        self.ids = ids;
        Ok(stack)
    }
}

/// One frame of a `frames` list. PyTorch writes `??` where it knows no file and line 0 where it
/// knows no line (its C++ frames); both are read as unknown, and written back the same way.
pub(super) fn read_frame(f: &Value, budget: &mut Budget, at: &dyn Fn() -> String, source: &str) -> Result<Frame> {
    budget.spend(f.len().max(1), at, source)?;
    let function =
        text(f, "name", budget, at, source)?.ok_or_else(|| bad(source, format!("{} has no `name`", at())))?;
    let file = text(f, "filename", budget, at, source)?.filter(|f| f != "??");
    let line = match f.get("line") {
        None | Some(Value::None) => None,
        Some(v) => match v.as_i128().map(u32::try_from) {
            Some(Ok(0)) => None,
            Some(Ok(line)) => Some(line),
            _ => {
                return Err(bad(
                    source,
                    format!("{}: `line` is {v:?}, expected a line number from 0 to {}", at(), u32::MAX),
                ))
            }
        },
    };
    Ok(Frame { function, file, line })
}
