#pragma once
// The snapshots a rank job wrote with --snapshot-out DIR/NAME.rank{rank}.json, read back as
// the agents' suites check them (tests/deepspeed, tests/fsdp): every rank's file decodes with
// our own decoder as that rank of the job, and passes the snapshot schema checks.

#include <QString>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snapshotquery.h"
#include "snapshotschema.h"
#include "wire/snapshot.h"

namespace shardscope::test {

// The --snapshot-out argument that makes each rank write dir/name.rankR.json.
inline QString rankSnapshotArg(const QString &dir, const QString &name)
{
    return dir + "/" + name + ".rank{rank}.json";
}

// The file rank `rank` wrote for rankSnapshotArg(dir, name).
inline QString rankSnapshotPath(const QString &dir, const QString &name, int rank)
{
    return dir + "/" + name + ".rank" + QString::number(rank) + ".json";
}

// Every rank's snapshot, in rank order, when each decodes with our decoder as rank R of a job
// of `world` ranks (in the fix dialect `dialect`, when one is given) and passes the schema
// checks; empty when any does not (what is wrong is printed).
inline std::vector<nlohmann::json> rankSnapshots(const QString &dir, const QString &name,
                                                 int world = 2, const std::string &dialect = {})
{
    std::vector<nlohmann::json> out;
    for (int rank = 0; rank < world; ++rank) {
        const QString path = rankSnapshotPath(dir, name, rank);
        auto decoded = shardscope::wire::readSnapshotFile(path.toStdString());
        if (!decoded) {
            qWarning("%s: %s", qPrintable(path), decoded.error().c_str());
            return {};
        }
        if (decoded->state.worldSize != world ||
            decoded->state.localRanks != std::vector<int>{rank} ||
            (!dialect.empty() && decoded->state.fixDialect != dialect)) {
            qWarning("%s: not rank %d of %d%s", qPrintable(path), rank, world,
                     dialect.empty() ? "" : (" in the " + dialect + " dialect").c_str());
            return {};
        }
        nlohmann::json j = readJson(path);
        const auto problems = snapshotSchemaProblems(j);
        for (const auto &p : problems)
            qWarning("%s: %s", qPrintable(path), p.c_str());
        if (!problems.empty()) return {};
        out.push_back(std::move(j));
    }
    return out;
}

} // namespace shardscope::test
