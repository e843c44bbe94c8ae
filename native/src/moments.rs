//! `ingest._align.SyncMoments` in compiled code: the clock-alignment moments of every clock domain.
//!
//! The lane finds tens of thousands of moments in a large log (every rank's step ends); handing
//! each to Python as a tuple and adding it there cost more than finding it. So the lane adds
//! them here itself, and the Python engine adds the lines it reads (`add`), in line order: the
//! store then holds exactly what `SyncMoments` would. `tests/ingest/test_align.py` checks the
//! two against each other.

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList};

struct Domain {
    name: String,
    stride: i64,
    /// step -> its timestamps, in the order they came
    keys: HashMap<i64, Vec<i64>>,
    /// the steps of `keys` in the order they came (the order `SyncMoments.points` has them in)
    order: Vec<i64>,
    /// it is in `points` (from its first moment on, even when a doubled stride empties it)
    listed: bool,
}

/// The shared moments seen so far per clock domain, in memory that does not grow with the log
/// (`SyncMoments`' rules: each domain keeps the steps divisible by its stride; at `cap` steps
/// the stride doubles and the others go).
#[pyclass(unsendable)]
pub struct MomentStore {
    cap: usize,
    domains: Vec<Domain>,
    by_name: HashMap<String, usize>,
    /// domains listed in `points`
    used: usize,
}

#[pymethods]
impl MomentStore {
    #[new]
    #[pyo3(signature = (cap = 4096))]
    fn new(cap: usize) -> Self {
        MomentStore { cap: cap.max(1), domains: Vec::new(), by_name: HashMap::default(), used: 0 }
    }

    /// The number the lane knows a domain by.
    pub fn domain_id(&mut self, name: &str) -> usize {
        if let Some(&d) = self.by_name.get(name) {
            return d;
        }
        self.domains.push(Domain { name: name.to_string(), stride: 1, keys: HashMap::default(), order: Vec::new(), listed: false });
        self.by_name.insert(name.to_string(), self.domains.len() - 1);
        self.domains.len() - 1
    }

    /// `SyncMoments.add`: only whole step numbers (and times) that fit in 64 bits are moments.
    fn add(&mut self, domain: &str, step: &Bound<'_, PyAny>, ts: &Bound<'_, PyAny>) {
        if !step.is_exact_instance_of::<PyInt>() {
            return;
        }
        let (Ok(step), Ok(ts)) = (step.extract::<i64>(), ts.extract::<i64>()) else { return };
        let d = self.domain_id(domain);
        self.add_id(d, step, ts);
    }

    /// `{domain: {step: [ts, …]}}`, as `SyncMoments.points`.
    #[getter]
    fn points<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for d in self.domains.iter().filter(|d| d.listed) {
            let keys = PyDict::new(py);
            for step in &d.order {
                keys.set_item(step, PyList::new(py, &d.keys[step])?)?;
            }
            out.set_item(&d.name, keys)?;
        }
        Ok(out)
    }

    /// `node_medians(points)`: each domain's time of each moment, the median of its timestamps as floats
    /// (`_align._median`: the middle one, or the mean of the two middle ones).
    fn medians<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let mut xs: Vec<f64> = Vec::new();
        for d in self.domains.iter().filter(|d| !d.order.is_empty()) {
            let keys = PyDict::new(py);
            for step in &d.order {
                xs.clear();
                xs.extend(d.keys[step].iter().map(|&t| t as f64));
                xs.sort_by(f64::total_cmp);
                let n = xs.len();
                let m = if n % 2 == 1 { xs[n / 2] } else { (xs[n / 2 - 1] + xs[n / 2]) / 2.0 };
                keys.set_item(step, m)?;
            }
            out.set_item(&d.name, keys)?;
        }
        Ok(out)
    }

    fn __bool__(&self) -> bool {
        self.used > 0
    }
}

impl MomentStore {
    /// `SyncMoments.add` for a domain by number.
    pub fn add_id(&mut self, domain: usize, step: i64, ts: i64) {
        let cap = self.cap;
        let d = &mut self.domains[domain];
        if step % d.stride != 0 {
            return;
        }
        if let Some(list) = d.keys.get_mut(&step) {
            list.push(ts);
            return;
        }
        if d.order.len() >= cap {
            d.stride = d.stride.saturating_mul(2);
            let stride = d.stride;
            d.order.retain(|k| k % stride == 0);
            d.keys.retain(|k, _| k % stride == 0);
            if step % stride != 0 {
                return;
            }
        }
        if !d.listed {
            d.listed = true;
            self.used += 1;
        }
        d.keys.insert(step, vec![ts]);
        d.order.push(step);
    }
}
