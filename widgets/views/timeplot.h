#pragma once
// The base of the gather timeline and the memory plot: a QCustomPlot whose time x axis drags
// and zooms horizontally only, the Follow live and Show all buttons, the live window (the
// zoom the user last chose), a redraw on a ~30 Hz timer when new data arrived, and the plot's
// tooltips and clicks.

#include <QPointF>
#include <QString>
#include <QWidget>

class QCustomPlot;
class QHBoxLayout;
class QTimer;
class QToolButton;
class QVBoxLayout;

namespace shardscope::views {

class TimePlot : public QWidget
{
    Q_OBJECT
  public:
    bool followLive() const { return m_followLive; }
    // Whether the data can still grow (attached to a running job). Not live (a snapshot, a run
    // that ended): Follow live is off and disabled, and the whole time range is shown as soon
    // as there is data, until the user zooms or drags. Live: Follow live on again.
    bool isLive() const { return m_live; }
    void setLive(bool live);
    void setVisibleRange(double t0Seconds, double t1Seconds); // turns follow-live off
    double visibleStart() const;
    double visibleEnd() const;
    QCustomPlot *plot() const { return m_plot; }
    // What hovering pos (plot widget coordinates) shows; empty over nothing.
    virtual QString toolTipAt(QPointF pos) const = 0;

  public Q_SLOTS:
    void setFollowLive(bool on);
    // Applies the data that arrived since the last refresh and redraws (the timer calls it).
    void refresh();
    // Turns follow-live off and shows all the data.
    void fitAll();

  Q_SIGNALS:
    void followLiveChanged(bool on);

  protected:
    // followToolTip says what Follow live keeps in view.
    TimePlot(const QString &followToolTip, QWidget *parent);

    // The bar above the plot, Follow live and Show all in it: subclasses add their controls.
    QHBoxLayout *toolBar() const { return m_toolBar; }
    // Adds a row between the bar and the plot.
    void addRowAbovePlot(QWidget *row);
    // New data or settings: the next timer tick refreshes.
    void markDirty() { m_dirty = true; }

    // What refresh() does before following the newest data and replotting.
    virtual void applyPending() = 0;
    // The time extent of the data in seconds; false when there is none.
    virtual bool dataRange(double &first, double &last) const = 0;
    // A left click that did not drag, at pos (plot widget coordinates).
    virtual void plotClicked(QPointF pos) { Q_UNUSED(pos); }
    // A key pressed while the plot has the focus; true when taken. The base takes Perfetto's
    // and Tracy's: W/S zoom in/out at the centre, A/D pan, F show all.
    virtual bool keyPressed(int key, Qt::KeyboardModifiers modifiers);
    // The user dragged over [t0, t1] with Shift held (a selection, not a pan).
    virtual void rangeDragged(double t0Seconds, double t1Seconds)
    {
        Q_UNUSED(t0Seconds);
        Q_UNUSED(t1Seconds);
    }

  private:
    bool eventFilter(QObject *watched, QEvent *e) override;
    void showRange(double first, double last);

    QVBoxLayout *m_layout = nullptr;
    QHBoxLayout *m_toolBar = nullptr;
    QToolButton *m_followButton = nullptr;
    QCustomPlot *m_plot = nullptr;
    QTimer *m_timer = nullptr;
    bool m_followLive = true;
    bool m_live = true;
    bool m_fitPending = false; // show all once data is there (not live, the user not zoomed yet)
    bool m_dirty = false;
    double m_liveWindow = 5.0; // seconds
    QPointF m_pressPos;
};

} // namespace shardscope::views
