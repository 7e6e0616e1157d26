#pragma once
// The engine's vocabulary as the inspector shows it: the names of base/names.h, the ones
// the engine and the snapshot use ("NOT_AVAILABLE", "unregistered_access", "float32"), as
// QStrings, and the inspector's own number formats.

#include <QString>

#include "state/shape.h"
#include "state/state.h"

namespace shardscope::session::labels {

QString status(ParamStatus s);
QString action(GuardAction a);
QString kind(ViolationKind k);
QString severity(Severity s); // "error", "cost", "info"
QString dtype(DType t);
QString reason(FetchReason r);
QString phase(Phase p);
QString shape(const Shape &s);         // "[4, 8]"
QString count(std::uint64_t n);        // "1,234,567"
QString bytes(std::uint64_t n);        // "12.5 MiB"
QString ranks(std::uint64_t rankMask); // "0-3", "0, 2"
// A duration in the unit that reads best: "850 ns", "12.4 µs", "874.7 ms", "43.52 s",
// "12 min 5 s", "2 h 3 min".
QString duration(std::uint64_t ns);
// The text with zero-width spaces after the characters of dotted names and calls ('.', '_',
// '(', ',', '/'), so a word-wrapped label can break `decoder.layers.3.mlp.fc1` instead of
// running past the edge. Display only: copy the original.
QString breakable(const QString &text);
// An FSDP2 unit's settings (ModuleRecord's unit fields), in FSDP's words:
// "reshard_after_forward=True; mesh dp=2", and "; grouped with embed" when another
// module (groupPath, "" for the root) heads its fully_shard call. "" for a module that is not
// a unit.
QString fsdpUnit(const state::ModuleRecord &m, const QString &groupPath);
// A module's type as the module tree shows it: "FSDPBlock [FSDP unit: ...]" for a unit.
QString moduleType(const state::ModuleRecord &m, const QString &groupPath);

} // namespace shardscope::session::labels
