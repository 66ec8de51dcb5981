//! Hostile PyTorch-style pickles, built byte by byte (protocol 4), as described in the
//! reliability issue: each is small, and stands for far more than a snapshot holds.
// Each test includes the builders it needs; not every one uses all of them.
#![allow(dead_code)]

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
    /// Pushes a string of any length.
    pub fn text(&mut self, text: &str) -> &mut Self {
        if text.len() < 256 {
            return self.s(text);
        }
        self.0.push(b'X');
        self.0.extend_from_slice(&(text.len() as u32).to_le_bytes());
        self.0.extend_from_slice(text.as_bytes());
        self
    }
    /// Pushes bytes (`BINBYTES`).
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.push(b'B');
        self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }
    /// Memoizes the value on top of the stack; returns its memo index.
    pub fn memoize(&mut self) -> u32 {
        self.0.push(0x94);
        self.1 += 1;
        self.1 - 1
    }
}

/// `{"segments": [], "device_traces": [[event] * refs]}`: one allocation event at time 0, built
/// by `fill` (which adds its keys and values after `action`, `addr`, `size`, `stream` and
/// `time_us`), referenced `refs` times.
fn shared_event(refs: u32, fill: impl FnOnce(&mut Pickle)) -> Vec<u8> {
    one_event_trace(refs, |p| {
        p.s("time_us").int(0);
        fill(p);
    })
}

/// `{"segments": [], "device_traces": [[event] * refs]}`: one allocation event, built by
/// `fill` (which adds its keys and values after `action`, `addr`, `size` and `stream`),
/// referenced `refs` times.
fn one_event_trace(refs: u32, fill: impl FnOnce(&mut Pickle)) -> Vec<u8> {
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
    p.s("action").s("alloc").s("addr").int(0).s("size").int(512).s("stream").int(0);
    fill(&mut p);
    p.op(b'u'); // event
    for _ in 1..refs {
        p.get(event);
    }
    p.op(b'e'); // the trace
    p.op(b'a'); // device_traces.append(trace)
    p.op(b'u'); // root: segments, device_traces
    p.op(b'.');
    p.0
}

/// One trace entry holding a `compile_context` of `len` bytes, referenced `refs` times (each
/// reference would copy it).
pub fn shared_compile_context(refs: u32, len: usize) -> Vec<u8> {
    shared_event(refs, |p| {
        p.s("frames").container(b']');
        p.s("compile_context").text(&"c".repeat(len));
    })
}

/// One trace entry whose only frame's name is `len` bytes, referenced `refs` times.
pub fn shared_frame_name(refs: u32, len: usize) -> Vec<u8> {
    shared_event(refs, |p| {
        p.s("frames").container(b']');
        p.op(b'(');
        p.container(b'}');
        p.op(b'(');
        p.s("name").text(&"f".repeat(len)).s("filename").s("train.py").s("line").int(3);
        p.op(b'u');
        p.op(b'e');
    })
}

/// One trace entry whose `user_metadata` is `len` bytes, referenced `refs` times.
pub fn shared_user_metadata(refs: u32, len: usize) -> Vec<u8> {
    shared_event(refs, |p| {
        p.s("frames").container(b']');
        p.s("user_metadata").text(&"m".repeat(len));
    })
}

/// One trace entry whose stack holds `frames` distinct frames, all named by one string of
/// `len` bytes (each distinct frame would copy and hash it).
pub fn distinct_frames_one_name(frames: u32, len: usize) -> Vec<u8> {
    shared_event(1, |p| {
        p.s("frames").container(b']');
        p.op(b'(');
        let mut name = None;
        for line in 0..frames {
            p.op(b'}').op(b'(');
            p.s("name");
            if let Some(index) = name {
                p.get(index);
            } else {
                p.text(&"f".repeat(len));
                name = Some(p.memoize());
            }
            p.s("filename").s("train.py").s("line").int(line + 1);
            p.op(b'u');
        }
        p.op(b'e');
    })
}

/// `{"segments": [], "allocator_settings": {"k0": b, "k1": b, ...}}` with `refs` keys naming
/// one bytes value of `len` bytes.
pub fn shared_settings_bytes(refs: u32, len: usize) -> Vec<u8> {
    let mut p = Pickle::new();
    p.container(b'}');
    p.op(b'(');
    p.s("segments");
    p.container(b']');
    p.s("allocator_settings");
    p.container(b'}');
    p.op(b'(');
    p.s("k0").bytes(&vec![7u8; len]);
    let value = p.memoize();
    for i in 1..refs {
        p.s(&format!("k{i}")).get(value);
    }
    p.op(b'u'); // settings
    p.op(b'u'); // root
    p.op(b'.');
    p.0
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
    one_event_trace(n, |p| {
        p.s("frames");
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
    })
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

/// A list put inside itself (`DUP`, `APPEND`) and popped off the stack, so that nothing the
/// pickle ends with reaches it, before a plain snapshot dict (found by `fuzz/run.sh`).
pub fn unreachable_cycle() -> Vec<u8> {
    let mut p = Pickle::new();
    p.op(b']').op(b'2').op(b'a').op(b'0');
    p.container(b'}');
    p.s("segments");
    p.op(b']');
    p.op(b's');
    p.op(b'.');
    p.0
}

impl Pickle {
    /// Pushes an unsigned integer as a nine-byte `LONG1` (any `u64`, 2^63 and above included).
    pub fn long(&mut self, n: u64) -> &mut Self {
        self.0.extend_from_slice(&[0x8a, 9]);
        self.0.extend_from_slice(&n.to_le_bytes());
        self.0.push(0);
        self
    }
}

/// A valid PyTorch-style snapshot with the 64-bit edges and odd fields of the third review:
/// a segment above 2^63 that is expandable, on a stream handle above 2^32; a second segment on
/// the stream 2^32 below it; a block dict that gives `size` twice (Python keeps the last); a
/// frame without `filename` or `line`; a trace entry with a dict as `user_metadata`.
pub fn pytorch_edges() -> Vec<u8> {
    const HIGH: u64 = (1 << 63) + (1 << 40);
    const LOW: u64 = 1 << 40;
    const SEG: u32 = 2 << 20;
    let mut p = Pickle::new();
    p.container(b'}');
    p.op(b'(');
    p.s("segments");
    p.container(b']');
    p.op(b'(');
    // The high segment.
    p.container(b'}');
    p.op(b'(');
    p.s("device").int(0).s("address").long(HIGH).s("total_size").int(SEG);
    p.s("allocated_size").int(512).s("active_size").int(512).s("requested_size").int(500);
    p.s("stream").long((1 << 32) + 16).s("segment_type").s("large");
    p.s("segment_pool_id").int(0).int(0).op(0x86).s("is_expandable").op(0x88);
    p.s("frames").container(b']');
    p.s("blocks").container(b']');
    p.op(b'(');
    p.container(b'}');
    p.op(b'(');
    p.s("address").long(HIGH).s("size").int(1).s("requested_size").int(500).s("state").s("active_allocated");
    p.s("size").int(512);
    p.s("frames").container(b']');
    p.op(b'(');
    p.container(b'}');
    p.op(b'(').s("name").s("torch::unwind::unwind()").op(b'u');
    p.container(b'}');
    p.op(b'(').s("name").s("train_step").s("filename").s("train.py").s("line").int(7).op(b'u');
    p.op(b'e'); // frames
    p.op(b'u'); // block
    p.container(b'}');
    p.op(b'(');
    p.s("address").long(HIGH + 512).s("size").int(SEG - 512).s("requested_size").int(0).s("state").s("inactive");
    p.s("frames").container(b']');
    p.op(b'u');
    p.op(b'e'); // blocks
    p.op(b'u'); // segment
                // The low segment, on the stream 2^32 below.
    p.container(b'}');
    p.op(b'(');
    p.s("device").int(0).s("address").long(LOW).s("total_size").int(SEG);
    p.s("allocated_size").int(0).s("active_size").int(0).s("requested_size").int(0);
    p.s("stream").long(16).s("segment_type").s("large");
    p.s("segment_pool_id").int(0).int(0).op(0x86).s("is_expandable").op(0x89);
    p.s("frames").container(b']');
    p.s("blocks").container(b']');
    p.op(b'(');
    p.container(b'}');
    p.op(b'(');
    p.s("address").long(LOW).s("size").int(SEG).s("requested_size").int(0).s("state").s("inactive");
    p.s("frames").container(b']');
    p.op(b'u');
    p.op(b'e'); // blocks
    p.op(b'u'); // segment
    p.op(b'e'); // segments
    p.s("device_traces").container(b']');
    p.container(b']');
    p.op(b'(');
    p.container(b'}');
    p.op(b'(');
    p.s("action").s("alloc").s("addr").long(HIGH).s("size").int(512).s("stream").long((1 << 32) + 16);
    p.s("time_us").long(1_700_000_000_000_000).s("compile_context").s("N/A");
    p.s("user_metadata").container(b'}');
    p.op(b'(').s("step").int(3).op(b'u');
    p.s("frames").container(b']');
    p.op(b'u'); // event
    p.op(b'e'); // trace
    p.op(b'a'); // device_traces
    p.s("allocator_settings").container(b'}');
    p.op(b'(').s("expandable_segments").op(0x88).op(b'u');
    p.op(b'u'); // root
    p.op(b'.');
    p.0
}

/// A snapshot of two GPUs, as PyTorch writes one from a process using both: a segment on each
/// device (1 MiB allocated on device 0, 3 MiB on device 1) and a trace per device, their
/// events interleaved in time.
pub fn two_devices() -> Vec<u8> {
    let mut p = Pickle::new();
    p.container(b'}');
    p.op(b'(');
    p.s("segments");
    p.container(b']');
    p.op(b'(');
    for (device, base, used) in [(0u32, 1u64 << 40, 1u32 << 20), (1, 2 << 40, 3 << 20)] {
        p.container(b'}');
        p.op(b'(');
        p.s("device").int(device).s("address").long(base).s("total_size").int(4 << 20);
        p.s("allocated_size").int(used).s("active_size").int(used).s("requested_size").int(used);
        p.s("stream").int(0).s("segment_type").s("large");
        p.s("segment_pool_id").int(0).int(0).op(0x86).s("is_expandable").op(0x89);
        p.s("frames").container(b']');
        p.s("blocks").container(b']');
        p.op(b'(');
        p.container(b'}');
        p.op(b'(');
        p.s("address").long(base).s("size").int(used).s("requested_size").int(used).s("state").s("active_allocated");
        p.s("frames").container(b']');
        p.op(b'(');
        p.container(b'}');
        p.op(b'(').s("name").s(&format!("step_on_gpu{device}")).s("filename").s("train.py").s("line").int(10 + device);
        p.op(b'u');
        p.op(b'e');
        p.op(b'u'); // block
        p.container(b'}');
        p.op(b'(');
        p.s("address").long(base + u64::from(used)).s("size").int((4 << 20) - used).s("requested_size").int(0);
        p.s("state").s("inactive").s("frames").container(b']');
        p.op(b'u');
        p.op(b'e'); // blocks
        p.op(b'u'); // segment
    }
    p.op(b'e'); // segments
    p.s("device_traces").container(b']');
    p.op(b'(');
    for (device, base, used, times) in
        [(0u32, 1u64 << 40, 1u32 << 20, [100u32, 300]), (1, 2 << 40, 3 << 20, [200, 400])]
    {
        p.container(b']');
        p.op(b'(');
        for (action, time) in [("segment_alloc", times[0]), ("alloc", times[1])] {
            p.container(b'}');
            p.op(b'(');
            p.s("action").s(action).s("addr").long(base).s("size");
            p.int(if action == "alloc" { used } else { 4 << 20 });
            p.s("stream").int(0).s("time_us").int(time).s("compile_context").s("N/A").s("user_metadata").s("");
            p.s("frames").container(b']');
            p.op(b'u');
        }
        p.op(b'e');
        let _ = device;
    }
    p.op(b'e'); // device_traces
    p.op(b'u'); // root
    p.op(b'.');
    p.0
}

/// One allocation event referenced `refs` times: millions of history entries in a few bytes
/// each.
pub fn identical_events(refs: u32) -> Vec<u8> {
    shared_event(refs, |_| {})
}
