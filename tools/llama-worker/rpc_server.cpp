// `opledger-llama-worker --rpc-server HOST:PORT [--threads N]`: this machine's CPU served as a
// remote device of ggml's RPC backend (ggml's own server, one client at a time), for
// `opledger rpc-server`. The server lives in the worker's process, beside the llama.cpp it was
// built with, so opledger itself links no llama.cpp. ggml-rpc.h is not among the headers the
// worker uses: the server's entry point is reached by name through the RPC registration, as
// `load` reaches ggml_backend_rpc_add_server.

#include "rpc_server.h"

#include "worker.h"

typedef void (*start_server_fn)(const char * endpoint, const char * cache_dir, size_t n_threads,
                                size_t n_devices, ggml_backend_dev_t * devices);

int serve_rpc(const char * endpoint, int threads) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (reg == nullptr) {
        fprintf(stderr, "this llama.cpp was built without its RPC backend (configure it with -DGGML_RPC=ON)\n");
        return 2;
    }
    auto start = (start_server_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_start_server");
    if (start == nullptr) {
        fprintf(stderr, "ggml's RPC backend does not export ggml_backend_rpc_start_server\n");
        return 2;
    }
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == nullptr) {
        fprintf(stderr, "ggml has no CPU device\n");
        return 2;
    }
    // blocks while serving
    start(endpoint, nullptr, (size_t) (threads > 0 ? threads : 1), 1, &cpu);
    fprintf(stderr, "the RPC server on %s stopped: %s\n", endpoint, log_tail(2).c_str());
    return 1;
}
