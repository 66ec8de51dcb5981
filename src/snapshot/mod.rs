//! Snapshot formats. For now: a reader for the pickles PyTorch writes with
//! `pickle.dump(torch.cuda.memory._snapshot(), f)`.

pub(crate) mod pickle;
