#pragma once
// The engine's Event record for Qt code. telemetry/event.h declares EventSink::emit(),
// which Qt's `emit` keyword macro would erase, so it is included with the macro suspended.
// Include this (not telemetry/event.h) from any file that also sees Qt headers.

#ifdef emit
#pragma push_macro("emit")
#undef emit
#include "telemetry/event.h"
#pragma pop_macro("emit")
#else
#include "telemetry/event.h"
#endif
