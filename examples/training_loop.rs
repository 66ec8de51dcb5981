//! A training-loop-shaped workload on the host backend, with the classic leak of keeping each
//! step's loss (and what it references) in a list. It measures live memory after every step,
//! reports the growth, and prints the allocator's memory summary.
//!
//! ```text
//! cargo run --release --example training_loop
//! ```

use vramscope::{Buffer, CachingAllocator, HostBackend};

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
    for step in 0..STEPS {
        let mut x = alloc.alloc::<f32>(&s, BATCH * WIDTH)?.with_shape(&[BATCH, WIDTH])?;
        x.as_host_slice_mut()?.iter_mut().enumerate().for_each(|(i, v)| *v = ((i + step) % 13) as f32 * 0.1);
        let h = forward(&alloc, &l1, &x, WIDTH)?;
        let y = forward(&alloc, &l2, &h, HIDDEN)?;
        let loss: f32 = y.as_host_slice()?.iter().map(|v| v * v).sum::<f32>() / y.len() as f32;
        if step % 2 == 0 {
            kept.push(y); // bug: `y` should be dropped with `x` and `h`
        }
        drop((x, h));
        live.push(alloc.memory_allocated());
        println!(
            "step {step:>2}: loss {loss:>9.5}  live {:>9} bytes  reserved {:>9} bytes",
            live[step],
            alloc.memory_reserved()
        );
    }
    let growth: Vec<i64> = live.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect();
    let grew = growth.iter().filter(|&&g| g > 0).count();
    if grew > 0 {
        println!(
            "\nleak: live memory grew in {grew} of {} steps, by {} bytes in all ({} buffers kept alive)",
            growth.len(),
            live[STEPS - 1] - live[0],
            kept.len()
        );
    } else {
        println!("\nno growth: live memory is steady");
    }
    println!("\n{}", alloc.memory_summary());
    Ok(())
}
