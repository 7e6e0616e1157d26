#pragma once
// Memory plot: per rank, partitioned and gathered parameter bytes over time (and the peak
// gathered bytes) from MemorySample events, with the max-live-parameters limit as a line, and
// the CUDA allocator's allocated and reserved bytes from AllocatorSample events where a run
// sends them (a GPU run; a CPU run has none and shows neither series).
// Ranks have distinct colours named in the legend, series distinct line styles; with many
// ranks it shows each series' minimum, median and maximum over ranks as a band, and a rank
// picked in its combo box over the band. A TimePlot: fed by appendEvents(), new samples are
// added to the graphs on its ~30 Hz timer.

#include <array>
#include <span>

#include <QSharedPointer>
#include <QVector>
#include <QWidget>

#include "state/state.h"
#include "telemetry/event.h"
#include "views/timeplot.h"

class QCPGraph;
class QCPAxis;
class QCPAxisTicker;
class QCPAxisTickerText;
class QCPItemStraightLine;
class QComboBox;
class QLabel;

namespace shardscope::views {

class MemoryPlot : public TimePlot
{
    Q_OBJECT
  public:
    enum class Series
    {
        Partitioned = 0,
        Gathered = 1,
        PeakGathered = 2,
        Allocated = 3, // torch.cuda.memory_allocated (AllocatorSample)
        Reserved = 4   // torch.cuda.memory_reserved
    };
    static constexpr int kSeriesCount = 5;
    // Up to this many ranks, every rank's lines are shown by default, each in its colour.
    static constexpr int kMaxRankLines = 8;

    enum class RankView
    {
        AllRanks = 0, // a line per rank and series
        Bands = 1,    // per series: min .. max over ranks as a band, the median as a line
    };
    enum class Band
    {
        Min = 0,
        Median = 1,
        Max = 2
    };

    explicit MemoryPlot(QWidget *parent = nullptr);

    // World size (a graph set per rank) and the limit: config.maxLiveParameters times the
    // element size of the dtype that holds most parameter elements.
    void setState(const state::EngineState &state);
    void setWorldSize(int worldSize);
    // maxLiveElements <= 0 removes the line.
    void setLimit(qint64 maxLiveElements, int bytesPerElement);
    // Time zero of the x axis (telemetry clock); without it the first sample sets it.
    void setTimeOrigin(quint64 tsNs);
    void appendEvents(std::span<const telemetry::Event> events);
    void clear();

    void setSeriesVisible(Series s, bool visible);
    // True once an allocator sample arrived: the allocated and reserved series have data.
    bool hasAllocatorSeries() const { return m_hasAllocator; }
    bool isSeriesVisible(Series s) const { return m_seriesVisible[int(s)]; }

    int rankCount() const { return int(m_graphs.size()); }
    // The graph of rank's series (keys: seconds since the origin, values: bytes), or nullptr.
    QCPGraph *graph(int rank, Series s) const;
    double limitBytes() const { return m_limitBytes; }
    qint64 limitElements() const { return m_limitElements; }
    // The last live-parameter element count rank reported (MemorySample a/b), or -1.
    qint64 liveElements(int rank) const;
    QComboBox *rankPicker() const { return m_picker; }

    // All ranks (the default up to kMaxRankLines ranks) or bands (the default above). A
    // picked rank (>= 0) is drawn over the bands in a strong colour; -1 picks none.
    void setRankView(RankView view, int pickedRank = -1);
    RankView rankView() const { return m_view; }
    // All ranks, 2 .. kMaxRankLines of them: a strip per rank, one above the other (ranks
    // that gather the same bytes would otherwise hide each other).
    bool strips() const
    {
        return m_view == RankView::AllRanks && m_graphs.size() > 1 &&
               m_graphs.size() <= kMaxRankLines;
    }
    int pickedRank() const { return m_picked; }
    // The band graph of a series (keys: seconds, values: bytes over the ranks sampled so far).
    QCPGraph *band(Series s, Band b) const;
    static QColor rankColor(int rank);
    static QColor seriesColor(Series s);
    // "rank 1, gathered: 8 kB at 2.000 s" for the visible line nearest pos (plot widget
    // coordinates) within a few pixels, or an empty string.
    QString toolTipAt(QPointF pos) const override;

    static QString formatBytes(double bytes);

  protected:
    // Moves the samples that arrived since the last refresh into the graphs.
    void applyPending() override;
    bool dataRange(double &first, double &last) const override;

  private:
    struct Pending
    {
        std::array<QVector<double>, kSeriesCount> keys; // memory and allocator samples differ
        std::array<QVector<double>, kSeriesCount> values;
    };

    // Drawn and listed: visible, and for the allocator's series, sampled at least once.
    bool shown(int s) const
    {
        return m_seriesVisible[std::size_t(s)] && (s < int(Series::Allocated) || m_hasAllocator);
    }
    void ensureRanks(int count);
    void updateValueRange();
    void updateLimitLabel();
    void applyView();
    void rebuildPicker();
    void addBandPoint(double t);

    QCPItemStraightLine *m_limitLine = nullptr;
    QLabel *m_limitLabel = nullptr;
    QComboBox *m_picker = nullptr;
    QVector<QCPAxis *> m_rankAxes;
    QSharedPointer<QCPAxisTicker> m_byteTicker;
    QSharedPointer<QCPAxisTickerText> m_stripTicker;
    QVector<std::array<QCPGraph *, kSeriesCount>> m_graphs;
    QVector<Pending> m_pending;
    // Bands: [series][Band]; legend keys of the line styles: [series].
    std::array<std::array<QCPGraph *, 3>, kSeriesCount> m_bands{};
    std::array<QCPGraph *, kSeriesCount> m_styleKeys{};
    struct BandSample
    {
        double t;
        int rank;
        std::array<double, kSeriesCount> values; // NaN: not in this sample
    };
    QVector<BandSample> m_bandSamples;                          // since the last refresh
    QVector<double> m_bandKeys;                                 // pending band points
    std::array<QVector<double>, kSeriesCount * 3> m_bandValues; // [series * 3 + band]
    std::array<QVector<double>, kSeriesCount> m_current;        // latest sample per rank, NaN: none
    RankView m_view = RankView::AllRanks;
    int m_picked = -1;
    bool m_viewChosen = false; // the user picked a view: rank counts no longer change it
    QVector<qint64> m_live;
    std::array<bool, kSeriesCount> m_seriesVisible = {true, true, false, true, true};
    bool m_hasAllocator = false; // an AllocatorSample was seen: its series are listed
    bool m_hasOrigin = false;
    quint64 m_origin = 0;
    bool m_hasData = false;
    double m_first = 0;
    double m_last = 0;
    double m_maxBytes[kSeriesCount] = {};
    qint64 m_limitElements = 0;
    int m_bytesPerElement = 4;
    double m_limitBytes = 0;
};

} // namespace shardscope::views
