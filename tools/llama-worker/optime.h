// Standalone op timing (the `time_op` request) and the expert ids of a TIMED decode
// (`capture_ids`): see PROTOCOL.md, "Timing one op alone".
#pragma once

#include "worker.h"

// "time_op": one node rebuilt as a one-op graph on its own device's backend, timed `reps` times;
// every repetition's ns is written into `out`.
void op_time_op(Worker & w, const Json & req, std::string & out);
