//! Hostile PyTorch-style pickles, built byte by byte (protocol 4), as described in the
//! reliability issue: each is small, and stands for far more than a snapshot holds.

/// A pickle writer for the few opcodes these files need.
pub struct Pickle(pub Vec<u8>, u32);

impl Pickle {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Pickle(vec![0x80, 4], 0)
    }
    /// Pushes a string.
    pub fn s(&mut self, text: &str) -> &mut Self {
        self.0.push(0x8c);
        self.0.push(text.len() as u8);
        self.0.extend_from_slice(text.as_bytes());
        self
    }
    /// Pushes a small integer.
    pub fn int(&mut self, n: u32) -> &mut Self {
        self.0.push(b'J');
        self.0.extend_from_slice(&n.to_le_bytes());
        self
    }
    /// Pushes an empty dict or list and memoizes it; returns its memo index.
    pub fn container(&mut self, op: u8) -> u32 {
        self.0.push(op);
        self.0.push(0x94);
        self.1 += 1;
        self.1 - 1
    }
    /// Pushes a memoized value again.
    pub fn get(&mut self, idx: u32) -> &mut Self {
        self.0.push(b'j');
        self.0.extend_from_slice(&idx.to_le_bytes());
        self
    }
    pub fn op(&mut self, op: u8) -> &mut Self {
        self.0.push(op);
        self
    }
}

/// `{"segments": [seg] * n}` where `seg` has `blocks = [block] * n`: n² blocks from O(n) bytes.
pub fn block_bomb(n: u32) -> Vec<u8> {
    let mut p = Pickle::new();
    p.container(b'}');
    p.s("segments");
    p.container(b']');
    p.op(b'(');
    let seg = p.container(b'}');
    p.op(b'(');
    p.s("address").int(0).s("total_size").int(1 << 20).s("stream").int(0).s("blocks");
    p.container(b']');
    p.op(b'(');
    let block = p.container(b'}');
    p.op(b'(');
    p.s("address").int(0).s("size").int(512).s("requested_size").int(512).s("state").s("active_allocated");
    p.op(b'u');
    for _ in 1..n {
        p.get(block);
    }
    p.op(b'e'); // the blocks list
    p.op(b'u'); // the segment dict
    for _ in 1..n {
        p.get(seg);
    }
    p.op(b'e'); // the segments list
    p.op(b's'); // root["segments"]
    p.op(b'.');
    p.0
}

/// `{"segments": [], "device_traces": [[event] * n]}` where the event's frames are
/// `[frame] * n`: n² frames from O(n) bytes.
pub fn frame_bomb(n: u32) -> Vec<u8> {
    let mut p = Pickle::new();
    p.container(b'}');
    p.op(b'(');
    p.s("segments");
    p.container(b']');
    p.s("device_traces");
    p.container(b']');
    p.container(b']');
    p.op(b'(');
    let event = p.container(b'}');
    p.op(b'(');
    p.s("action").s("alloc").s("addr").int(0).s("size").int(512).s("stream").int(0).s("frames");
    p.container(b']');
    p.op(b'(');
    let frame = p.container(b'}');
    p.op(b'(');
    p.s("name").s("train_step").s("filename").s("train.py").s("line").int(3);
    p.op(b'u');
    for _ in 1..n {
        p.get(frame);
    }
    p.op(b'e'); // frames
    p.op(b'u'); // event
    for _ in 1..n {
        p.get(event);
    }
    p.op(b'e'); // the trace
    p.op(b'a'); // device_traces.append(trace)
    p.op(b'u'); // root: segments, device_traces
    p.op(b'.');
    p.0
}

/// A list that contains itself, inside a dict that looks like a snapshot.
pub fn cycle() -> Vec<u8> {
    let mut p = Pickle::new();
    p.container(b'}');
    p.s("segments");
    let l = p.container(b']');
    p.get(l);
    p.op(b'a');
    p.op(b's');
    p.op(b'.');
    p.0
}
