#include "session/sessionstore.h"

namespace shardscope::session {

SessionStore::SessionStore(QObject *parent) : QObject(parent)
{
    qRegisterMetaType<shardscope::session::StoreChanges>();
    m_timer.setInterval(33);
    connect(&m_timer, &QTimer::timeout, this, &SessionStore::flush);
    m_timer.start();
}

QString SessionStore::modulePath(ModuleId id) const
{
    // The common case without a std::string in between; the core says the rest.
    if (const state::ModuleRecord *m = m_core.module(id); m && !m->path.empty())
        return QString::fromStdString(m->path);
    return QString::fromStdString(m_core.modulePath(id));
}

QString SessionStore::paramName(ParamId id) const
{
    if (const state::ParamRecord *p = m_core.param(id)) return QString::fromStdString(p->name);
    return QString::fromStdString(m_core.paramName(id));
}

void SessionStore::flush()
{
    StoreChanges changes = m_core.takeChanges();
    if (changes.any()) Q_EMIT updated(changes);
}

} // namespace shardscope::session
