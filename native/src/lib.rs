//! jobtrace's compiled parts, the Python extension module `jobtrace_native`: each writes event lines byte for
//! byte as its Python reference does, and hands back to Python whatever it does not write exactly.
//!
//! * `lane`: the ingest fast lane (`FastLane`, used by `ingest._lane` and `ingest._engine`), reading the
//!   common lines of a training log; one module per log family, with `literals` (how trigger lines are
//!   found) and `moments` (the clock-alignment moments, `MomentStore`).
//! * `recorder`: the training thread's recorder (`Recorder`, `Span`, `Collective`, used by
//!   `otel_instrumentation._native`).
//! * `line_writer`: every event line either writes, and the JSON in it.

use pyo3::prelude::*;

mod lane;
mod line_writer;
mod literals;
mod moments;
mod recorder;

#[pymodule]
fn jobtrace_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<lane::FastLane>()?;
    m.add_class::<moments::MomentStore>()?;
    recorder::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
