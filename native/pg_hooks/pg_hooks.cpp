// jobtrace's process-group hooks in C++: every collective of a gloo (or other host-timed) group recorded
// without the GIL.
//
// Python pre/post hooks (otel_instrumentation/_collectives.py) cost each collective two or three GIL
// hand-overs: DDP's reducer issues its all-reduces from the autograd engine, which runs without the GIL.
// These hooks are std::functions registered with ProcessGroup::registerPreHook/registerPostHook; the
// completion is a C++ callback on the work's future. Records wait here, under one mutex, until the
// heartbeat or export thread drains them into the recorder (drain()). The Python thread that set the context
// function (the training thread) takes the GIL once per collective to ask the recorder for its step and
// innermost span, so that the record nests where it was issued, as the Python hooks' do; that call takes
// no Python objects of the op (the Python hooks' cost is converting them). Other threads never take it.
//
// Built on first need by torch.utils.cpp_extension (otel_instrumentation/_native_hooks.py), against the
// torch that runs the job.

#include <torch/csrc/distributed/c10d/Hooks.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace py = pybind11;
using c10d::HookOpName;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Record {
  int64_t id = 0;
  int op = 0;  // HookOpName
  int group = 0;
  int64_t t0 = 0, t1 = 0;
  int64_t seq = -1, p2p_seq = -1, peer = -1;
  int64_t nbytes = 0;
  int64_t step = INT64_MIN;
  uint64_t parent = 0;  // span ids are 64 random bits
  bool async_only = false;
  bool asked = false;  // step and parent came from the recorder (context_fn), None included
  std::string error;
};

struct Group {
  int index = 0;
  int64_t seq = 0, p2p_seq = 0;
  std::unordered_map<int64_t, Record> issued;  // op_id -> what the pre-hook saw
};

struct State {
  std::mutex mu;
  py::object* context_fn = nullptr;  // () -> (step or None, span id or None), asked on context_thread only
  std::thread::id context_thread;
  std::unordered_map<int64_t, Record> outstanding;  // record id -> issued, not completed
  std::vector<Record> done;
  std::atomic<int64_t> errors{0}, next_id{1};
  std::vector<std::shared_ptr<Group>> groups;
};

State& state() {
  static State* s = new State();  // never destroyed: callbacks may outlive interpreter teardown
  return *s;
}

bool skipped(HookOpName name) {
  return name == HookOpName::SPLIT || name == HookOpName::NEW_WINDOW || name == HookOpName::UNKNOWN;
}

bool p2p(HookOpName name) {
  return name == HookOpName::SEND || name == HookOpName::RECV;
}

void finish(int64_t id, int64_t t1, std::string error) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.outstanding.find(id);
  if (it == s.outstanding.end()) return;
  Record r = std::move(it->second);
  s.outstanding.erase(it);
  r.t1 = t1 < r.t0 ? r.t0 : t1;
  r.error = std::move(error);
  s.done.push_back(std::move(r));
}

// Hooks `pg` as group `index`; attaching the same index again (after detach) keeps its counters, so that
// sequence numbers stay those of the other ranks.
void attach(const py::object& pg_obj, int index, int64_t hook_id) {
  auto pg = pg_obj.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  std::shared_ptr<Group> group;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    for (const auto& g : state().groups)
      if (g->index == index) group = g;
    if (!group) {
      group = std::make_shared<Group>();
      group->index = index;
      state().groups.push_back(group);
    }
  }
  pg->registerPreHook(hook_id, [group](const c10d::PreHookArgs& a) {
    try {
      if (skipped(a.name)) return;
      Record r;
      r.t0 = now_ns();
      r.op = static_cast<int>(a.name);
      r.group = group->index;
      for (const auto& t : a.input_tensors) r.nbytes += static_cast<int64_t>(t.nbytes());
      if (state().context_fn != nullptr && std::this_thread::get_id() == state().context_thread &&
          Py_IsInitialized()) {
        try {
          py::gil_scoped_acquire gil;
          py::tuple got = (*state().context_fn)();
          r.asked = true;
          if (!got[0].is_none()) r.step = got[0].cast<int64_t>();
          if (!got[1].is_none()) r.parent = got[1].cast<uint64_t>();
        } catch (...) {
          state().errors++;
        }
      }
      std::lock_guard<std::mutex> lock(state().mu);
      if (p2p(a.name)) {
        r.p2p_seq = ++group->p2p_seq;
        r.peer = a.root;
      } else {
        r.seq = ++group->seq;
      }
      group->issued[a.op_id] = std::move(r);
    } catch (...) {
      state().errors++;
    }
  });
  pg->registerPostHook(hook_id, [group](const c10d::PostHookArgs& a) {
    try {
      State& s = state();
      int64_t id;
      {
        std::lock_guard<std::mutex> lock(s.mu);
        auto it = group->issued.find(a.op_id);
        if (it == group->issued.end()) return;
        Record r = std::move(it->second);
        group->issued.erase(it);
        id = r.id = s.next_id++;
        s.outstanding.emplace(id, std::move(r));
      }
      c10::intrusive_ptr<c10::ivalue::Future> fut;
      if (a.work) {
        try {
          fut = a.work->getFuture();
        } catch (...) {
          fut.reset();
        }
      }
      if (!fut) {
        {
          std::lock_guard<std::mutex> lock(s.mu);
          auto it = s.outstanding.find(id);
          if (it != s.outstanding.end()) it->second.async_only = true;
        }
        finish(id, now_ns(), "");
        return;
      }
      fut->addCallback([id](c10::ivalue::Future& f) {
        std::string error;
        if (f.hasError()) error = f.tryRetrieveErrorMessage().substr(0, 500);
        finish(id, now_ns(), std::move(error));
      });
    } catch (...) {
      state().errors++;
    }
  });
}

void detach(const py::object& pg_obj, int64_t hook_id) {
  auto pg = pg_obj.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  pg->unregisterPreHook(hook_id);
  pg->unregisterPostHook(hook_id);
}

void set_context_fn(py::object fn) {
  // Leaked on purpose: hooks may fire while the interpreter tears down, after a static py::object is gone.
  state().context_fn = fn.is_none() ? nullptr : new py::object(std::move(fn));
  state().context_thread = std::this_thread::get_id();
}

py::list drain() {
  std::vector<Record> got;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    got.swap(state().done);
  }
  py::list out;
  for (const auto& r : got) {
    py::object step = r.step == INT64_MIN ? py::none() : py::object(py::int_(r.step));
    py::object err = r.error.empty() ? py::none() : py::object(py::str(r.error));
    out.append(py::make_tuple(r.op, r.group, r.t0, r.t1, r.seq, r.p2p_seq, r.peer, r.nbytes, step,
                              r.parent, r.async_only, err, r.asked));
  }
  return out;
}

py::object oldest() {
  std::lock_guard<std::mutex> lock(state().mu);
  const Record* best = nullptr;
  for (const auto& kv : state().outstanding)
    if (!best || kv.second.t0 < best->t0) best = &kv.second;
  if (!best) return py::none();
  return py::make_tuple(best->op, best->group, best->seq, best->t0, best->nbytes);
}

int64_t errors() { return state().errors.load(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "jobtrace's process-group hooks without the GIL (see otel_instrumentation/_native_hooks.py)";
  m.def("attach", &attach, py::arg("pg"), py::arg("index"), py::arg("hook_id"));
  m.def("detach", &detach, py::arg("pg"), py::arg("hook_id"));
  m.def("set_context_fn", &set_context_fn, py::arg("fn"));
  m.def("drain", &drain);
  m.def("oldest", &oldest);
  m.def("errors", &errors);
}
