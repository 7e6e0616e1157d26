#pragma once
// Partition map: ranks x flat offsets of one parameter (or of a module's parameters,
// stacked), each rank's shard drawn at [r*p, (r+1)*p), coloured by that rank's status,
// with the tail padding hatched. Painted by hand; readable from 1 to 64 ranks.

#include <QColor>
#include <QPointF>
#include <QRectF>
#include <QString>
#include <QVector>
#include <QWidget>

#include "state/state.h"

namespace shardscope::views {

// One rank's shard of one parameter, in widget coordinates.
struct ShardRect
{
    ParamId param = kNoParam;
    int band = 0; // index of the parameter in the stacked display
    int rank = 0;
    std::int64_t offset = 0;     // first flat element of the shard (r * p)
    std::int64_t length = 0;     // shard length p, padding included
    std::int64_t validNumel = 0; // real elements in the shard
    std::int64_t paddingNumel = 0;
    ParamStatus status = ParamStatus::NotAvailable;
    bool partitioned = true; // false: every rank holds the whole tensor
    QRectF row;              // the rank's full row: x spans the padded length
    QRectF data;             // the real elements; empty when the shard is all padding
    QRectF padding;          // the tail padding; empty when the shard has none
};

class PartitionMap : public QWidget
{
    Q_OBJECT
  public:
    explicit PartitionMap(QWidget *parent = nullptr);

    // Keeps the parameters and modules of state; the selection is kept when it still exists.
    void setState(const state::EngineState &state);
    void clear();

    // Shows exactly these records, already resolved by the caller (e.g. the session store's
    // current records of the selection); cheaper than setState for live status updates.
    void setRecords(int worldSize, const std::vector<state::ParamRecord> &records);

    // Shows one parameter; kNoParam shows nothing.
    void setParameter(ParamId id);
    // Shows the parameters owned by module, stacked in id order.
    void setModule(ModuleId id);

    ParamId selectedParameter() const { return m_selectedParam; }
    ModuleId selectedModule() const { return m_selectedModule; }
    int worldSize() const { return m_worldSize; }

    // The rectangles the last layout computed for the current size (what paint draws).
    QVector<ShardRect> shardRects() const;
    // The shard under pos, or nullptr.
    const ShardRect *shardAt(QPointF pos) const;
    // Parameters of the selected module left out because they do not fit at this size.
    int hiddenParameters() const;
    // Height of one rank row at the current size.
    double rowHeight() const;

    static QColor statusColor(ParamStatus s);
    QString toolTipFor(const ShardRect &r) const;

    QSize sizeHint() const override;
    QSize minimumSizeHint() const override;

  protected:
    void paintEvent(QPaintEvent *event) override;
    void resizeEvent(QResizeEvent *event) override;
    bool event(QEvent *event) override;

  private:
    void rebuildShown();
    const state::ParamRecord *findParam(ParamId id) const;
    void layoutRects() const;
    int bandHeaderHeight() const;
    int legendHeight() const;
    QVector<QPointF> legendPositions() const; // x, line of each legend entry
    int labelWidth() const;

    std::vector<state::ParamRecord> m_allParams; // sorted by id, as in EngineState
    int m_worldSize = 1;
    ParamId m_selectedParam = kNoParam;
    ModuleId m_selectedModule = kNoModule;
    QVector<state::ParamRecord> m_shown; // one band each

    mutable bool m_layoutDirty = true;
    mutable QSize m_layoutSize;
    mutable QVector<QRectF> m_headers; // one per band: the parameter's name line
    mutable QVector<ShardRect> m_rects;
    mutable double m_rowHeight = 0;
    mutable int m_hiddenBands = 0;
    mutable QRectF m_moreNote;
};

} // namespace shardscope::views
