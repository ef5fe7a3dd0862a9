// The log functions of sapiens_seg._core (log_binding.cpp).
#pragma once

#include <pybind11/pybind11.h>

// set_log_level, log_level, set_log_handler.
void bind_log(pybind11::module_& m);
