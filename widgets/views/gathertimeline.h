#pragma once
// Gather timeline: one lane per rank with fetch spans coloured by reason (concurrent ones
// stacked in sub-rows), release and broadcast marks, violation markers and step
// boundaries, on a TimePlot (zoomed and panned in time with the mouse, following the newest
// events). Fed by appendEvents(); redrawn on the TimePlot's ~30 Hz timer.

#include <array>
#include <optional>
#include <span>
#include <vector>

#include <QColor>
#include <QHash>
#include <QList>
#include <QMap>
#include <QPointF>
#include <QString>
#include <QWidget>

#include "models/rangesummarymodel.h"
#include "state/state.h"
#include "telemetry/event.h"
#include "views/gathertimeline_spans.h"
#include "views/timeplot.h"

class QLabel;
class QSpinBox;
class QToolButton;

namespace shardscope::views {

class GatherLanesPlottable;

class GatherTimeline : public TimePlot
{
    Q_OBJECT
  public:
    explicit GatherTimeline(QWidget *parent = nullptr);
    ~GatherTimeline() override;

    // World size (lanes shown even before a rank sends events) and parameter names.
    void setState(const state::EngineState &state);
    void setWorldSize(int worldSize);
    // Time zero of the x axis (telemetry clock); without it the first event sets it.
    // Give every plot the same origin to line them up.
    void setTimeOrigin(quint64 tsNs);
    void appendEvents(std::span<const telemetry::Event> events);
    void clear();

    // Highlights the spans of these parameters (e.g. the tree's selection).
    void setSelection(const QList<quint32> &paramIds);
    QList<quint32> selection() const;

    // All ranks folded into one summary lane (how many ranks gather for forward, backward
    // and the rest at each moment, every rank's violations above), or a lane per rank.
    void setFolded(bool folded);
    bool folded() const { return m_folded; }
    // Lanes drawn: 1 when folded, else laneCount().
    int shownLanes() const { return m_folded ? 1 : laneCount(); }
    // The summary lane's count at time t: ranks gathering for forward, for backward, for
    // anything else (each rank counted once, in the first of these its gathers at t have).
    std::array<int, 3> ranksGatheringAt(double tSeconds) const;
    static std::int8_t foldedCategory(SpanKind kind);

    std::size_t spanCount() const { return m_spans.spanCount(); }
    std::size_t markCount() const { return m_spans.markCount(); }
    std::size_t violationCount() const { return m_spans.violationCount(); }
    std::size_t reduceScatterCount() const { return m_spans.reduceScatterCount(); }
    int laneCount() const;
    const GatherSpans &spans() const { return m_spans; }

    // What is drawn at the current zoom and size: one entry per block (a span, or
    // several sub-pixel spans merged).
    std::vector<TimelineBlock> visibleBlocks() const;
    // The block under pos (plot widget coordinates), and its parameters.
    std::optional<TimelineBlock> blockAt(QPointF pos) const;
    // The fetch in flight drawn under pos (it runs to the newest event, as drawn).
    std::optional<OpenFetch> openFetchAt(QPointF pos) const;
    // Parameters of the block under pos, or else of the fetch in flight there: a finished
    // span wins where both are, its extent being final while the other's grows.
    QList<quint32> paramsAt(QPointF pos) const;
    // What hovering pos shows, for a block or a fetch in flight; empty over nothing.
    QString toolTipAt(QPointF pos) const override;
    // Pixel position (plot widget coordinates) of time t on rank's fetch sub-row `row`.
    QPointF positionOf(int rank, double tSeconds, int row = 0) const;
    // The same on rank's reduce-scatter track (below the fetches).
    QPointF reduceScatterPositionOf(int rank, double tSeconds) const;

    // Navigation, as profiler users expect it (the keys are in keyboardHelp()):
    // Shows step `step` from its first StepBegin to the next step's; false when no rank has
    // begun it.
    bool goToStep(std::uint32_t step);
    // Centres the view, at its zoom, on the next (forward) or previous violation after the
    // view's centre, on rank (any when rank < 0); says which (violationShown) and returns it.
    std::optional<GatherSpans::Found> goToViolation(bool forward, int rank = -1);
    // The same for the next or previous gather (fetch span) of a parameter.
    std::optional<GatherSpans::Found> goToGather(ParamId param, bool forward);
    // A time range's gathers per module (the module whose entry caused them) and per
    // parameter, with their names: what a Shift+drag over the plot selects (rangeSelected).
    std::vector<models::RangeRow> rangeSummary(double t0Seconds, double t1Seconds,
                                               int rank = -1) const;

    // The keys the timeline takes, one "key: what" per line (also in the app's Help menu).
    static QString keyboardHelp();

    // The step labels above the lanes at the current zoom, by time: as many as fit.
    QMap<double, QString> stepLabels() const;
    static QColor kindColor(SpanKind kind);
    // A fetch's reason ("forward", ...), a mark's event type ("release", "broadcast"),
    // "violation" or "reduce-scatter": the names the engine, the snapshot and docs use.
    static QString kindName(SpanKind kind);

  Q_SIGNALS:
    void paramsClicked(const QList<quint32> &paramIds);
    // goToViolation found this violation mark (time in seconds on the axis).
    void violationShown(int rank, quint32 paramId, quint32 accessorId, double tSeconds);
    // The user selected [t0, t1] with Shift+drag (every rank).
    void rangeSelected(double t0Seconds, double t1Seconds);

  protected:
    void applyPending() override;
    bool dataRange(double &first, double &last) const override;
    // Selects the parameters of what was clicked and says which they were.
    void plotClicked(QPointF pos) override;

  private:
    bool updateLanes(); // true when the lanes or their labels changed
    struct LanePoint
    {
        int rank = 0;
        double dy = 0;    // pixels from the lane's centre, negative above
        double laneH = 0; // pixels
    };
    std::optional<LanePoint> lanePointAt(QPointF pos) const;
    double secondsPerPixel() const;
    void updateStepLabels();
    void centreOn(double tSeconds);
    bool keyPressed(int key, Qt::KeyboardModifiers modifiers) override;
    void rangeDragged(double t0Seconds, double t1Seconds) override;
    QSpinBox *m_stepBox = nullptr;

    GatherSpans m_spans;
    GatherLanesPlottable *m_lanes = nullptr;
    QLabel *m_legend = nullptr;
    int m_worldSize = 0;
    int m_shownLanes = -1;
    bool m_folded = false;
    QToolButton *m_foldButton = nullptr;
    std::vector<ParamId> m_selection; // sorted
    QHash<quint32, QString> m_paramNames;
    QHash<quint32, QString> m_moduleNames;

    friend class GatherLanesPlottable;
};

} // namespace shardscope::views
