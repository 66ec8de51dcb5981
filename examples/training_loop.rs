//! A training-loop-shaped workload on the host backend, with the classic leak of keeping every
//! other step's output in a list. vramscope records every allocation (stack, scope, step);
//! at the end the example names the leaking line, writes a flamegraph of live memory, a JSON
//! snapshot and a PyTorch-format pickle under `target/vramscope/training_loop/`, and prints
//! the memory summary.
//!
//! ```text
//! cargo run --release --example training_loop --features flamegraph
//! ```

use vramscope::{backend::HostBackend, Buffer, CachingAllocator};

const BATCH: usize = 16;
const WIDTH: usize = 1024;
const HIDDEN: usize = 4096;
const STEPS: usize = 12;

struct Linear {
    weight: Buffer<f32>,
    bias: Buffer<f32>,
}

fn linear(alloc: &CachingAllocator, inputs: usize, outputs: usize) -> vramscope::Result<Linear> {
    let s = alloc.default_stream();
    let mut weight = alloc.alloc::<f32>(&s, inputs * outputs)?.with_shape(&[outputs, inputs])?;
    weight.as_host_slice_mut()?.iter_mut().enumerate().for_each(|(i, w)| *w = ((i % 7) as f32 - 3.0) * 1e-3);
    let bias = alloc.alloc::<f32>(&s, outputs)?.with_shape(&[outputs])?;
    Ok(Linear { weight, bias })
}

/// y = x W^T + b, computed on the host for real, so the buffers hold data.
fn forward(alloc: &CachingAllocator, layer: &Linear, x: &Buffer<f32>, inputs: usize) -> vramscope::Result<Buffer<f32>> {
    let outputs = layer.bias.len();
    let rows = x.len() / inputs;
    let mut y = alloc.alloc::<f32>(&alloc.default_stream(), rows * outputs)?.with_shape(&[rows, outputs])?;
    let (xs, w, b) = (x.as_host_slice()?, layer.weight.as_host_slice()?, layer.bias.as_host_slice()?);
    for (r, out) in y.as_host_slice_mut()?.chunks_mut(outputs).enumerate() {
        let row = &xs[r * inputs..(r + 1) * inputs];
        for (o, v) in out.iter_mut().enumerate() {
            let wrow = &w[o * inputs..(o + 1) * inputs];
            *v = b[o] + row.iter().zip(wrow).map(|(a, c)| a * c).sum::<f32>();
        }
    }
    Ok(y)
}

fn main() -> vramscope::Result<()> {
    let alloc = CachingAllocator::new(HostBackend::new(2 << 30));
    let s = alloc.default_stream();
    let l1 = linear(&alloc, WIDTH, HIDDEN)?;
    let l2 = linear(&alloc, HIDDEN, WIDTH)?;
    let mut kept = Vec::new(); // the leak: a list that keeps every step's output alive
    let mut live = Vec::new();
    let _train = vramscope::scope("train");
    // Live memory before the first step (the weights): each step is compared with the one before.
    let start = alloc.memory_allocated();
    for step in 0..STEPS {
        vramscope::step(step as u64);
        let _step = vramscope::scope("step");
        let mut x = alloc.alloc::<f32>(&s, BATCH * WIDTH)?.with_shape(&[BATCH, WIDTH])?;
        x.as_host_slice_mut()?.iter_mut().enumerate().for_each(|(i, v)| *v = ((i + step) % 13) as f32 * 0.1);
        let h = {
            let _s = vramscope::scope("layer1");
            forward(&alloc, &l1, &x, WIDTH)?
        };
        let y = {
            let _s = vramscope::scope("layer2");
            forward(&alloc, &l2, &h, HIDDEN)?
        };
        let loss: f32 = y.as_host_slice()?.iter().map(|v| v * v).sum::<f32>() / y.len() as f32;
        if step % 2 == 0 {
            kept.push(y); // bug: `y` should be dropped with `x` and `h`
        } else {
            drop(y);
        }
        drop((x, h));
        live.push(alloc.memory_allocated());
        println!(
            "step {step:>2}: loss {loss:>9.5}  live {:>9} bytes  reserved {:>9} bytes",
            live[step],
            alloc.memory_reserved()
        );
    }
    let before = std::iter::once(start).chain(live.iter().copied());
    let grew = before.zip(&live).filter(|(b, &a)| a > *b).count();
    println!(
        "\nlive memory grew in {grew} of {STEPS} steps, by {}",
        vramscope::report::format_bytes(live[STEPS - 1] - start)
    );

    let snapshot = alloc.snapshot();
    let leaks = vramscope::report::leaks(&snapshot);
    print!("\n{}", vramscope::report::LeakCandidate::render(&leaks));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/vramscope/training_loop");
    std::fs::create_dir_all(&dir).map_err(|error| vramscope::Error::Io { path: dir.display().to_string(), error })?;
    let folded = vramscope::report::folded(&snapshot, vramscope::report::FoldedKind::Live);
    let files = [
        ("live.svg", vramscope::report::flamegraph(&folded, "live memory after training")?.into_bytes()),
        ("snapshot.json", snapshot.to_json().into_bytes()),
        ("snapshot.pickle", snapshot.to_pytorch_pickle()),
    ];
    for (name, bytes) in files {
        let path = dir.join(name);
        std::fs::write(&path, bytes)
            .map_err(|error| vramscope::Error::Io { path: path.display().to_string(), error })?;
        println!("wrote {}", path.display());
    }
    // The summary while the leak is still alive: allocated memory includes what `kept` holds.
    println!("\n{}", alloc.memory_summary());
    drop(kept);
    Ok(())
}
