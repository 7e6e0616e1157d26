#include "views/attachdialog.h"

#include <QDateTime>

#include <QDialogButtonBox>
#include <QFormLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QScreen>
#include <QScrollBar>
#include <QTableWidget>
#include <QTimer>
#include <QVBoxLayout>
#include <algorithm>

#include "session/jobsession.h"
#include "wire/discovery.h"
#include "wire/endpoint.h"

namespace shardscope::views {

namespace {

QString uptime(std::uint64_t startUnixMs)
{
    const qint64 now = QDateTime::currentMSecsSinceEpoch();
    const qint64 s = std::max<qint64>(0, (now - static_cast<qint64>(startUnixMs)) / 1000);
    if (s < 60) return QStringLiteral("%1 s").arg(s);
    if (s < 3600) return QStringLiteral("%1 min %2 s").arg(s / 60).arg(s % 60);
    return QStringLiteral("%1 h %2 min").arg(s / 3600).arg((s % 3600) / 60);
}

} // namespace

AttachDialog::AttachDialog(const QString &discoveryDir, QWidget *parent)
    : QDialog(parent),
      m_dir(QString::fromStdString(session::JobSession::discoveryDirOf(discoveryDir))),
      m_table(new QTableWidget(0, 7, this)), m_endpoint(new QLineEdit(this)),
      m_token(new QLineEdit(this)), m_hint(new QLabel(this)), m_timer(new QTimer(this))
{
    setWindowTitle(tr("Attach to a training run"));
    m_table->setHorizontalHeaderLabels({tr("PID"), tr("Model"), tr("World size"), tr("Backend"),
                                        tr("Uptime"), tr("Endpoint"), tr("Ranks")});
    m_table->verticalHeader()->hide();
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    // Every column as wide as its contents (a model's name is long); the dialog widens to
    // show them, up to the screen, and the table scrolls beyond that.
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->setWordWrap(false);
    m_table->setTextElideMode(Qt::ElideNone);
    m_endpoint->setPlaceholderText(QStringLiteral(
        "unix:/run/user/1000/shardscope/1234.sock,  tcp:127.0.0.1:7000  or  job:NAME"));
    m_token->setPlaceholderText(tr("only for an engine started with --token"));
    m_token->setEchoMode(QLineEdit::Password);
    m_hint->setWordWrap(true);

    auto *form = new QFormLayout;
    form->addRow(tr("Endpoint:"), m_endpoint);
    form->addRow(tr("Token:"), m_token);
    auto *buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
    buttons->button(QDialogButtonBox::Ok)->setText(tr("Attach"));
    auto *layout = new QVBoxLayout(this);
    layout->addWidget(new QLabel(tr("Live engines on this machine (%1):").arg(m_dir), this));
    layout->addWidget(m_table);
    layout->addWidget(m_hint);
    layout->addLayout(form);
    layout->addWidget(buttons);
    resize(760, 420);

    connect(buttons, &QDialogButtonBox::accepted, this, [this] {
        const QString spec = endpoint();
        if (spec.isEmpty()) return;
        // The one parser of what to attach to (the command lines' too), in its words.
        if (const auto target = wire::parseAttachTarget(spec.toStdString()); !target) {
            m_hint->setText(QString::fromStdString(target.error()));
            return;
        }
        accept();
    });
    connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
    connect(m_table, &QTableWidget::itemSelectionChanged, this, [this] {
        const auto rows = m_table->selectionModel()->selectedRows();
        if (!rows.isEmpty()) m_endpoint->setText(m_table->item(rows.first().row(), 5)->text());
    });
    connect(m_table, &QTableWidget::cellDoubleClicked, this, [this](int row, int) {
        m_endpoint->setText(m_table->item(row, 5)->text());
        accept();
    });
    m_timer->setInterval(1000);
    connect(m_timer, &QTimer::timeout, this, &AttachDialog::refresh);
    m_timer->start();
    refresh();
}

QString AttachDialog::endpoint() const
{
    return m_endpoint->text().trimmed();
}

QString AttachDialog::token() const
{
    return m_token->text();
}

int AttachDialog::engineCount() const
{
    return m_engines;
}

int AttachDialog::jobCount() const
{
    return m_jobs;
}

void AttachDialog::refresh()
{
    // The session lists the live engines, grouped by job and ordered by rank.
    const std::vector<client::LiveJob> jobs = session::JobSession::liveJobs(m_dir);
    const QString selected =
        m_table->selectionModel()->selectedRows().isEmpty()
            ? QString()
            : m_table->item(m_table->selectionModel()->selectedRows().first().row(), 5)->text();
    // A job of several processes (or one whose other ranks are not live) gets a row of its
    // own above them, which attaches to all of them.
    struct Row
    {
        QString cells[7];
        QString tip;
        bool job = false;
    };
    std::vector<Row> rows;
    m_jobs = 0;
    std::size_t engines = 0;
    for (const client::LiveJob &job : jobs) {
        const wire::DiscoveryEntry &first = job.processes.front();
        engines += job.processes.size();
        const int world = job.worldSize;
        if (job.named && (job.processes.size() > 1 || static_cast<int>(job.ranks.size()) < world)) {
            Row r;
            r.job = true;
            const QString id = QString::fromStdString(job.id);
            r.cells[0] = tr("job");
            r.cells[1] = QString::fromStdString(job.model);
            r.cells[2] = QString::number(world);
            r.cells[3] = QString::fromStdString(first.backend);
            r.cells[4] = uptime(first.startUnixMs);
            r.cells[5] = QStringLiteral("job:") + id;
            r.cells[6] = tr("%1 of %2 ranks live (%3 processes)")
                             .arg(job.ranks.size())
                             .arg(world)
                             .arg(job.processes.size());
            r.tip = tr("job %1: attaches to every live process of the job at once").arg(id);
            rows.push_back(r);
            ++m_jobs;
        }
        for (const wire::DiscoveryEntry &e : job.processes) {
            Row r;
            QStringList rankList;
            for (int x : e.job.ranks)
                rankList << QString::number(x);
            r.cells[0] = QString::number(e.pid);
            r.cells[1] = QString::fromStdString(e.model);
            r.cells[2] = QString::number(e.worldSize);
            r.cells[3] = QString::fromStdString(e.backend);
            r.cells[4] = uptime(e.startUnixMs);
            r.cells[5] = QString::fromStdString(e.endpoint);
            r.cells[6] = rankList.isEmpty()
                             ? QString()
                             : (rankList.size() == 1 ? tr("rank ") : tr("ranks ")) +
                                   rankList.join(QLatin1Char(',')) +
                                   (e.job.host.empty()
                                        ? QString()
                                        : tr(" on %1").arg(QString::fromStdString(e.job.host)));
            if (e.tokenRequired) r.tip = tr("this engine requires a token");
            rows.push_back(r);
        }
    }
    m_engines = static_cast<int>(engines);
    // The ranks column only when some process says which ranks it runs (a job's).
    m_table->setColumnHidden(6, std::none_of(rows.begin(), rows.end(), [](const Row &row) {
                                 return !row.cells[6].isEmpty();
                             }));
    m_table->setRowCount(static_cast<int>(rows.size()));
    for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
        const Row &row = rows[static_cast<std::size_t>(r)];
        for (int c = 0; c < 7; ++c) {
            auto *item = m_table->item(r, c);
            if (!item) {
                item = new QTableWidgetItem;
                m_table->setItem(r, c, item);
            }
            item->setText(row.cells[c]);
            item->setToolTip(row.tip.isEmpty() ? row.cells[c] : row.tip);
            QFont f = item->font();
            f.setBold(row.job);
            item->setFont(f);
        }
        if (row.cells[5] == selected) {
            const QSignalBlocker block(m_table);
            m_table->selectRow(r);
        }
    }
    // The first row (a whole job when there is one) is picked when none is, so Enter
    // attaches to it.
    if (!rows.empty() && selected.isEmpty() && m_endpoint->text().isEmpty()) m_table->selectRow(0);
    fitToTable();
    m_hint->setText(engines == 0 ? tr("No live engine found. Start one with shardscope-train, "
                                      "or type its endpoint below.")
                                 : QString());
}

void AttachDialog::fitToTable()
{
    m_table->resizeColumnsToContents();
    const int tableWidth = m_table->horizontalHeader()->length() + 2 * m_table->frameWidth() +
                           m_table->verticalScrollBar()->sizeHint().width();
    const QMargins margins = layout()->contentsMargins();
    int wanted = tableWidth + margins.left() + margins.right();
    if (const QScreen *screen = this->screen())
        wanted = std::min(wanted, screen->availableGeometry().width() - 40);
    if (wanted > width()) resize(wanted, height());
}

} // namespace shardscope::views
