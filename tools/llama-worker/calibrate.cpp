// The isolation calibration's raw rounds: a graph of trivial nodes, dispatched as the captured
// graph is node for node (a view for a node without work, a SIGMOID for one ggml computes on
// one thread, an ADD for one it splits over every thread), computed by a ggml scheduler on a
// CPU backend on the worker's thread pool, with the instrument's own callback answering "yes"
// at every node (TIMED: each node timed from its ask to its observe call, as a TIMED run's)
// and without a callback (FUSED: the graph's wall), for several rounds. The worker returns the
// rounds as measured; opledger computes the isolation from them.

#include "worker.h"

int cpu_plan_threads(const ggml_tensor * t) {
    // a context for one graph of one node, reused: ggml_graph_plan reads the node's op,
    // parameters and sources and allocates nothing
    static ggml_context * ctx = [] {
        ggml_init_params p = {ggml_graph_overhead_custom(1, false) + 1024, nullptr, true};
        return ggml_init(p);
    }();
    if (ctx == nullptr) {
        return 0;
    }
    ggml_reset(ctx);
    ggml_cgraph * g = ggml_new_graph_custom(ctx, 1, false);
    ggml_graph_add_node(g, const_cast<ggml_tensor *>(t));
    return ggml_graph_plan(g, 64, nullptr).n_threads;
}

// Frees what the calibration made, in reverse order, whatever way it ends.
struct CalibrationGraph {
    ggml_context * ctx = nullptr;
    ggml_backend_t backend = nullptr;
    ggml_backend_sched_t sched = nullptr;

    ~CalibrationGraph() {
        if (sched) {
            ggml_backend_sched_free(sched);
        }
        if (backend) {
            ggml_backend_free(backend);
        }
        if (ctx) {
            ggml_free(ctx);
        }
    }
};

// "calibrate": `pattern` (per node 0: no work, 1: one thread, 2: every thread), `rounds`.
void op_calibrate(Worker & w, const Json & req, std::string & out) {
    if (w.pool == nullptr) {
        throw std::runtime_error("no model: send 'load' first");
    }
    std::vector<int32_t> pattern = ints_field(req, "pattern");
    if (pattern.empty() || pattern.size() > 1000000) {
        throw std::runtime_error("field 'pattern' must hold 1 to 1000000 nodes");
    }
    for (int32_t p : pattern) {
        if (p < 0 || p > 2) {
            throw std::runtime_error("field 'pattern' holds " + std::to_string(p) + " (0, 1 or 2)");
        }
    }
    int64_t rounds = int_field(req, "rounds");
    if (rounds < 1 || rounds > 1000) {
        throw std::runtime_error("field 'rounds' must be 1 to 1000");
    }
    size_t nodes = pattern.size();
    int64_t width = 256 * (int64_t) w.threads;
    CalibrationGraph cg;
    ggml_init_params p = {ggml_tensor_overhead() * (nodes + 8) + ggml_graph_overhead_custom(nodes + 8, false), nullptr,
                          true};
    cg.ctx = ggml_init(p);
    cg.backend = ggml_backend_cpu_init();
    if (cg.ctx == nullptr || cg.backend == nullptr) {
        throw std::runtime_error("ggml could not make the calibration graph's context or CPU backend");
    }
    ggml_backend_cpu_set_n_threads(cg.backend, w.threads);
    ggml_backend_cpu_set_threadpool(cg.backend, w.pool);
    cg.sched = ggml_backend_sched_new(&cg.backend, nullptr, 1, nodes + 8, false, false);
    if (cg.sched == nullptr) {
        throw std::runtime_error("ggml_backend_sched_new failed for the calibration graph");
    }
    ggml_tensor * a = ggml_new_tensor_1d(cg.ctx, GGML_TYPE_F32, width);
    ggml_tensor * b = ggml_new_tensor_1d(cg.ctx, GGML_TYPE_F32, width);
    ggml_set_input(a);
    ggml_set_input(b);
    // a chain, as a real graph is: every node reads the one before
    ggml_tensor * y = a;
    for (int32_t d : pattern) {
        y = d == 0 ? ggml_reshape_1d(cg.ctx, y, width) : d == 1 ? ggml_sigmoid(cg.ctx, y) : ggml_add(cg.ctx, y, b);
    }
    ggml_set_output(y);
    ggml_cgraph * graph = ggml_new_graph_custom(cg.ctx, nodes + 8, false);
    ggml_build_forward_expand(graph, y);
    if (!ggml_backend_sched_alloc_graph(cg.sched, graph)) {
        throw std::runtime_error("allocating the calibration graph failed");
    }
    std::vector<float> zeros((size_t) width, 0.0f);
    ggml_backend_tensor_set(a, zeros.data(), 0, zeros.size() * sizeof(float));
    ggml_backend_tensor_set(b, zeros.data(), 0, zeros.size() * sizeof(float));
    Observer obs;
    auto compute = [&](bool timed) {
        if (timed) {
            obs.reset(Observe::Timed);
            ggml_backend_sched_set_eval_callback(cg.sched, eval_cb, &obs);
        } else {
            ggml_backend_sched_set_eval_callback(cg.sched, nullptr, nullptr);
        }
        uint64_t t0 = now_ns();
        enum ggml_status status = ggml_backend_sched_graph_compute(cg.sched, graph);
        uint64_t ns = now_ns() - t0;
        if (status != GGML_STATUS_SUCCESS) {
            throw std::runtime_error(std::string("the calibration graph (") + (timed ? "timed" : "fused") +
                                     ") failed: ggml status " + std::to_string((int) status));
        }
        return ns;
    };
    // warm the pool and the buffers up, both ways
    compute(false);
    compute(true);
    std::string timed_json = "[";
    std::string fused_json = "[";
    for (int64_t r = 0; r < rounds; r++) {
        compute(true);
        if (obs.timed_ns.size() != nodes) {
            throw std::runtime_error("the calibration graph observed " + std::to_string(obs.timed_ns.size()) +
                                     " nodes of " + std::to_string(nodes));
        }
        timed_json += r ? ",[" : "[";
        for (size_t k = 0; k < nodes; k++) {
            timed_json += k ? "," : "";
            json_u64(timed_json, obs.timed_ns[k]);
        }
        timed_json += "]";
        uint64_t fused = compute(false);
        fused_json += r ? "," : "";
        json_u64(fused_json, fused);
    }
    ggml_backend_sched_set_eval_callback(cg.sched, nullptr, nullptr);
    w.pause();
    out += ",\"timed_ns\":" + timed_json + "]";
    out += ",\"fused_ns\":" + fused_json + "]";
}
