#pragma once
// The attach dialog: the live engines found through discovery files (pid, model, world
// size, backend, uptime, ranks), grouped by job with a row per job that attaches to all of
// its processes ("3 of 4 ranks live"), refreshed every second, and an endpoint and token
// typed by hand.

#include <QDialog>
#include <QString>

#include <string>
#include <vector>

class QLabel;
class QLineEdit;
class QTableWidget;
class QTimer;

namespace shardscope::views {

class AttachDialog : public QDialog
{
    Q_OBJECT
  public:
    // discoveryDir: where to look; empty means the default runtime directory.
    explicit AttachDialog(const QString &discoveryDir = {}, QWidget *parent = nullptr);

    // What to attach to: an endpoint, endpoints separated by commas, or job:NAME (a job row).
    QString endpoint() const;
    QString token() const;
    int engineCount() const; // live processes listed
    int jobCount() const;    // job rows (jobs of several processes, or with ranks missing)
    QTableWidget *enginesTable() const { return m_table; }

  public Q_SLOTS:
    void refresh();

  private:
    void fitToTable();

    QString m_dir;
    QTableWidget *m_table;
    QLineEdit *m_endpoint;
    QLineEdit *m_token;
    QLabel *m_hint;
    QTimer *m_timer;
    int m_engines = 0;
    int m_jobs = 0;
};

} // namespace shardscope::views
