#pragma once

// Serves this machine's CPU on `endpoint` (HOST:PORT) with ggml's RPC server; returns the
// process's exit status when it cannot start or stops.
int serve_rpc(const char * endpoint, int threads);
