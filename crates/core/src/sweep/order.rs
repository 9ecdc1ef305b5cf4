//! The order an engine's cumulative depth sweep must follow ([`crate::engine::SweepEngine`]):
//! each mode's pass starts once, then takes its chunks in order, with decode steps right after a
//! chunk. Kept once here for every engine that runs sweeps itself.

use crate::engine::{EngineError, Mode};

/// A depth sweep in progress: its chunk count, each mode's next chunk (FUSED in one context,
/// the observed modes in the other, run in lockstep) and the decode steps after every chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassOrder {
    chunks: u32,
    next: [Option<u32>; 2],
    decode: Option<(u32, u32)>,
}

/// The context a mode's pass runs in: FUSED in its own, FUSED-observed and TIMED in the other.
fn slot(mode: Mode) -> usize {
    usize::from(mode != Mode::Fused)
}

impl PassOrder {
    /// A sweep of `chunks` chunks, with `decode` = (steps, sequences) after every chunk; no pass
    /// started.
    pub fn new(chunks: u32, decode: Option<(u32, u32)>) -> PassOrder {
        PassOrder {
            chunks,
            next: [None, None],
            decode,
        }
    }

    /// The decode steps after every chunk, (steps, sequences).
    pub fn decode(&self) -> Option<(u32, u32)> {
        self.decode
    }

    /// Whether a pass may start at `first_chunk`.
    pub fn check_start(&self, first_chunk: u32) -> Result<(), EngineError> {
        if first_chunk > self.chunks {
            return Err(EngineError::Failed(format!(
                "a pass starting at chunk {first_chunk} of {}",
                self.chunks
            )));
        }
        Ok(())
    }

    /// Whether `mode`'s pass is at chunk `index`.
    pub fn check_chunk(&self, mode: Mode, index: u32) -> Result<(), EngineError> {
        if self.next[slot(mode)] == Some(index) && index < self.chunks {
            return Ok(());
        }
        Err(EngineError::Failed(format!(
            "pass_chunk({}, {index}) out of order (sweep state {self:?})",
            mode.label()
        )))
    }

    /// Whether `mode`'s pass has just decoded chunk `after_chunk` and the sweep was prepared for
    /// `steps` decode steps of `parallel` sequences.
    pub fn check_decode(
        &self,
        mode: Mode,
        after_chunk: u32,
        steps: u32,
        parallel: u32,
    ) -> Result<(), EngineError> {
        if self.next[slot(mode)] == Some(after_chunk + 1) && self.decode == Some((steps, parallel))
        {
            return Ok(());
        }
        Err(EngineError::Failed(format!(
            "pass_decode({}, {after_chunk}) out of order (sweep state {self:?})",
            mode.label()
        )))
    }

    /// `mode`'s pass is now at chunk `next`.
    pub fn set_next(&mut self, mode: Mode, next: u32) {
        self.next[slot(mode)] = Some(next);
    }

    /// No pass started (the contexts were emptied).
    pub fn reset(&mut self) {
        self.next = [None, None];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_come_in_order_per_context_and_decode_after_the_chunk_it_follows() {
        let mut o = PassOrder::new(3, Some((2, 1)));
        assert!(o.check_chunk(Mode::Fused, 0).is_err(), "no pass started");
        assert!(o.check_start(3).is_ok() && o.check_start(4).is_err());
        o.set_next(Mode::Fused, 0);
        assert!(o.check_chunk(Mode::Fused, 0).is_ok());
        assert!(o.check_chunk(Mode::Fused, 1).is_err());
        // TIMED shares the observed context with FUSED-observed, not FUSED's
        assert!(o.check_chunk(Mode::Timed, 0).is_err());
        o.set_next(Mode::Fused, 1);
        assert!(o.check_decode(Mode::Fused, 0, 2, 1).is_ok());
        assert!(
            o.check_decode(Mode::Fused, 0, 2, 2).is_err(),
            "other decode steps"
        );
        assert!(o.check_decode(Mode::Fused, 1, 2, 1).is_err());
        o.set_next(Mode::Fused, 3);
        assert!(
            o.check_chunk(Mode::Fused, 3).is_err(),
            "past the last chunk"
        );
        o.reset();
        assert!(o.check_decode(Mode::Fused, 2, 2, 1).is_err());
    }
}
