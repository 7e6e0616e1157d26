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
      m_dir(discoveryDir.isEmpty() ? QString::fromStdString(wire::defaultRuntimeDir())
                                   : discoveryDir),
      m_table(new QTableWidget(0, 6, this)), m_endpoint(new QLineEdit(this)),
      m_token(new QLineEdit(this)), m_hint(new QLabel(this)), m_timer(new QTimer(this))
{
    setWindowTitle(tr("Attach to a training run"));
    m_table->setHorizontalHeaderLabels(
        {tr("PID"), tr("Model"), tr("World size"), tr("Backend"), tr("Uptime"), tr("Endpoint")});
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
    m_endpoint->setPlaceholderText(
        QStringLiteral("unix:/run/user/1000/shardscope/1234.sock  or  tcp:127.0.0.1:7000"));
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
        const auto parsed = wire::parseEndpoint(endpoint().toStdString());
        if (!parsed) {
            m_hint->setText(tr("`%1` is not an endpoint: %2. Use unix:PATH or tcp:HOST:PORT.")
                                .arg(endpoint(), QString::fromStdString(parsed.error())));
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
    return m_table->rowCount();
}

void AttachDialog::refresh()
{
    const std::vector<wire::DiscoveryEntry> engines = wire::listLiveEngines(m_dir.toStdString());
    const QString selected =
        m_table->selectionModel()->selectedRows().isEmpty()
            ? QString()
            : m_table->item(m_table->selectionModel()->selectedRows().first().row(), 5)->text();
    m_table->setRowCount(static_cast<int>(engines.size()));
    for (int r = 0; r < static_cast<int>(engines.size()); ++r) {
        const wire::DiscoveryEntry &e = engines[static_cast<std::size_t>(r)];
        const QString cells[] = {QString::number(e.pid),
                                 QString::fromStdString(e.model),
                                 QString::number(e.worldSize),
                                 QString::fromStdString(e.backend),
                                 uptime(e.startUnixMs),
                                 QString::fromStdString(e.endpoint) +
                                     (e.tokenRequired ? tr("  (token)") : QString())};
        for (int c = 0; c < 6; ++c) {
            auto *item = m_table->item(r, c);
            if (!item) {
                item = new QTableWidgetItem;
                m_table->setItem(r, c, item);
            }
            item->setText(c == 5 ? QString::fromStdString(e.endpoint) : cells[c]);
            item->setToolTip(c == 5 && e.tokenRequired ? tr("this engine requires a token")
                                                       : cells[c]);
        }
        if (QString::fromStdString(e.endpoint) == selected) {
            const QSignalBlocker block(m_table);
            m_table->selectRow(r);
        }
    }
    // The first run is picked when none is, so Enter attaches to it.
    if (!engines.empty() && selected.isEmpty() && m_endpoint->text().isEmpty())
        m_table->selectRow(0);
    fitToTable();
    m_hint->setText(engines.empty() ? tr("No live engine found. Start one with shardscope-train, "
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
