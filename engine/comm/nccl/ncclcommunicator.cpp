// NCCL calls go through the dlopen'ed NcclApi; every failure becomes a CommError naming
// the call, the rank and NCCL's own error string.

#include "comm/nccl/ncclcommunicator.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "comm/nccl/cudacheck.h"
#include "comm/nccl/ncclapi.h"

namespace shardscope::comm {

namespace {

void checkNccl(ncclResult_t r, const char *call, int rank, ncclComm_t comm = nullptr)
{
    if (r == ncclSuccess || r == ncclInProgress) return;
    const NcclApi &api = ncclApi();
    std::string msg = std::string("NCCL call ") + call + " failed on rank " + std::to_string(rank) +
                      ": " + api.getErrorString(r);
    const char *last = api.getLastError ? api.getLastError(comm) : nullptr;
    if (last && *last) msg += std::string(" (") + last + ")";
    throw comm::CommError(msg);
}

class EventHandle final : public comm::CommHandle::Impl
{
  public:
    EventHandle(cudaEvent_t ev, int device, int rank, std::function<std::string()> asyncError)
        : m_event(ev), m_device(device), m_rank(rank), m_asyncError(std::move(asyncError))
    {
    }
    ~EventHandle() override
    {
        int current = 0;
        cudaGetDevice(&current);
        cudaSetDevice(m_device);
        cudaEventDestroy(m_event);
        cudaSetDevice(current);
    }
    bool ready() override
    {
        const cudaError_t err = cudaEventQuery(m_event);
        if (err == cudaErrorNotReady) {
            // Not an error, but the runtime records it as the thread's last error: the
            // next kernel's launch check (cudaGetLastError) would fail with it.
            cudaGetLastError();
            return false;
        }
        SHARDSCOPE_CUDA_CHECK(err);
        return true;
    }
    // Polls rather than cudaEventSynchronize, so that a collective that can never finish
    // (a peer failed or exited) becomes NCCL's asynchronous error instead of a hang.
    void wait() override
    {
        for (int polls = 0;; ++polls) {
            if (ready()) return;
            if (polls % 64 == 63) {
                const std::string why = m_asyncError();
                if (!why.empty())
                    throw comm::CommError("a collective on rank " + std::to_string(m_rank) +
                                          " failed asynchronously: " + why +
                                          " (another rank probably failed or exited)");
            }
            if (polls < 2000)
                std::this_thread::yield();
            else
                std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

  private:
    cudaEvent_t m_event;
    int m_device;
    int m_rank;
    std::function<std::string()> m_asyncError;
};

bool isDevicePointer(const void *p)
{
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

} // namespace

NcclCommunicator::NcclCommunicator(void *ncclComm, int rank, int worldSize, int device)
    : m_rank(rank), m_world(worldSize), m_device(device)
{
    m_state->comm.store(ncclComm);
    SHARDSCOPE_CUDA_CHECK(cudaSetDevice(device));
    SHARDSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&m_commStream, cudaStreamNonBlocking));
    SHARDSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&m_inputsReady, cudaEventDisableTiming));
    SHARDSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&m_lastDone, cudaEventDisableTiming));
    SHARDSCOPE_CUDA_CHECK(cudaMalloc(&m_barrierBuf, sizeof(double)));
    m_memory = std::make_unique<comm::CudaMemory>(device, m_computeStream, m_commStream);
}

NcclCommunicator::~NcclCommunicator()
{
    cudaSetDevice(m_device);
    if (m_ownComputeStream) cudaStreamSynchronize(m_ownComputeStream);
    drainCommStream();
    {
        std::lock_guard lock(m_state->mutex);
        if (void *comm = m_state->comm.exchange(nullptr))
            ncclApi().commDestroy(static_cast<ncclComm_t>(comm));
    }
    cudaFree(m_barrierBuf);
    cudaEventDestroy(m_inputsReady);
    cudaEventDestroy(m_lastDone);
    cudaStreamDestroy(m_commStream);
    if (m_ownComputeStream) cudaStreamDestroy(m_ownComputeStream);
}

void NcclCommunicator::drainCommStream() noexcept
{
    if (!m_commStream) return;
    // cudaStreamSynchronize would wait for ever on a collective whose peer died (the
    // destructor runs while an error propagates): poll, and abort once NCCL reports it.
    cudaError_t q;
    while ((q = cudaStreamQuery(m_commStream)) == cudaErrorNotReady) {
        cudaGetLastError(); // not ready is recorded as the last error (see EventHandle::ready)
        bool failed = false;
        try {
            std::lock_guard lock(m_state->mutex);
            void *comm = m_state->comm.load();
            ncclResult_t async = ncclSuccess;
            failed =
                comm &&
                ncclApi().commGetAsyncError(static_cast<ncclComm_t>(comm), &async) == ncclSuccess &&
                async != ncclSuccess && async != ncclInProgress;
        } catch (...) {
        }
        if (failed) abort(); // its kernels exit, so the stream drains
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (q != cudaSuccess) cudaGetLastError();
}

void NcclCommunicator::bindThread()
{
    SHARDSCOPE_CUDA_CHECK(cudaSetDevice(m_device));
}

void NcclCommunicator::setComputeStream(cudaStream_t stream)
{
    m_computeStream = stream;
    m_memory->setComputeStream(stream);
}

cudaStream_t NcclCommunicator::useOwnComputeStream()
{
    if (!m_ownComputeStream) {
        SHARDSCOPE_CUDA_CHECK(cudaSetDevice(m_device));
        SHARDSCOPE_CUDA_CHECK(
            cudaStreamCreateWithFlags(&m_ownComputeStream, cudaStreamNonBlocking));
    }
    setComputeStream(m_ownComputeStream);
    return m_ownComputeStream;
}

void NcclCommunicator::before(const char *what, const void *a, const void *b)
{
    if ((a && !isDevicePointer(a)) || (b && !isDevicePointer(b)))
        throw comm::CommError(std::string("NCCL ") + what + " on rank " + std::to_string(m_rank) +
                              " was given a host pointer; the NCCL backend needs device buffers "
                              "(cudaMalloc), see Communicator::deviceBuffers()");
    SHARDSCOPE_CUDA_CHECK(cudaSetDevice(m_device));
    if (!commPtr())
        throw comm::CommError("NCCL communicator of rank " + std::to_string(m_rank) +
                              " was aborted after a failure on another rank");
    if (m_orderAfterCompute) commWaitFor(m_computeStream);
}

comm::CommHandle NcclCommunicator::after()
{
    cudaEvent_t ev = nullptr;
    SHARDSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    const cudaError_t err = cudaEventRecord(ev, m_commStream);
    if (err != cudaSuccess) {
        cudaEventDestroy(ev);
        SHARDSCOPE_CUDA_CHECK(err);
    }
    SHARDSCOPE_CUDA_CHECK(cudaEventRecord(m_lastDone, m_commStream));
    std::weak_ptr<CommState> state = m_state;
    auto asyncError = [state]() -> std::string {
        const std::shared_ptr<CommState> st = state.lock();
        if (!st) return {};
        std::lock_guard lock(st->mutex);
        void *comm = st->comm.load();
        if (!comm) return {};
        ncclResult_t async = ncclSuccess;
        const NcclApi &api = ncclApi();
        if (api.commGetAsyncError(static_cast<ncclComm_t>(comm), &async) != ncclSuccess ||
            async == ncclSuccess || async == ncclInProgress)
            return {};
        std::string why = api.getErrorString(async);
        const char *last = api.getLastError(static_cast<ncclComm_t>(comm));
        if (last && *last) why += std::string(" (") + last + ")";
        return why;
    };
    return comm::CommHandle(
        std::make_shared<EventHandle>(ev, m_device, m_rank, std::move(asyncError)));
}

comm::CommHandle NcclCommunicator::allGather(const void *send, void *recv, std::size_t bytes)
{
    if (bytes == 0) return {};
    before("allGather", send, recv);
    checkNccl(ncclApi().allGather(send, recv, bytes, ncclUint8, static_cast<ncclComm_t>(commPtr()),
                                  m_commStream),
              "ncclAllGather", m_rank, static_cast<ncclComm_t>(commPtr()));
    return after();
}

comm::CommHandle NcclCommunicator::broadcast(void *buf, std::size_t bytes, int root)
{
    if (root < 0 || root >= m_world)
        throw comm::CommError("broadcast on rank " + std::to_string(m_rank) + ": root " +
                              std::to_string(root) + " is not a rank of a world of " +
                              std::to_string(m_world));
    if (bytes == 0) return {};
    before("broadcast", buf, nullptr);
    checkNccl(ncclApi().broadcast(buf, buf, bytes, ncclUint8, root,
                                  static_cast<ncclComm_t>(commPtr()), m_commStream),
              "ncclBroadcast", m_rank, static_cast<ncclComm_t>(commPtr()));
    return after();
}

comm::CommHandle NcclCommunicator::reduceScatter(const void *send, void *recv, std::size_t count,
                                                 DType dtype)
{
    if (count == 0) return {};
    before("reduceScatter", send, recv);
    const ncclDataType_t type = dtype == DType::BF16 ? ncclBfloat16 : ncclFloat32;
    checkNccl(ncclApi().reduceScatter(send, recv, count, type, ncclSum,
                                      static_cast<ncclComm_t>(commPtr()), m_commStream),
              "ncclReduceScatter", m_rank, static_cast<ncclComm_t>(commPtr()));
    return after();
}

void NcclCommunicator::barrier()
{
    before("barrier", nullptr, nullptr);
    checkNccl(ncclApi().allReduce(m_barrierBuf, m_barrierBuf, 1, ncclFloat64, ncclSum,
                                  static_cast<ncclComm_t>(commPtr()), m_commStream),
              "ncclAllReduce (barrier)", m_rank, static_cast<ncclComm_t>(commPtr()));
    after().wait(); // polls NCCL for asynchronous errors instead of hanging
}

void NcclCommunicator::streamWaitComm(cudaStream_t stream)
{
    SHARDSCOPE_CUDA_CHECK(cudaSetDevice(m_device));
    SHARDSCOPE_CUDA_CHECK(cudaEventRecord(m_lastDone, m_commStream));
    SHARDSCOPE_CUDA_CHECK(cudaStreamWaitEvent(stream, m_lastDone, 0));
}

void NcclCommunicator::commWaitFor(cudaStream_t producer)
{
    SHARDSCOPE_CUDA_CHECK(cudaSetDevice(m_device));
    SHARDSCOPE_CUDA_CHECK(cudaEventRecord(m_inputsReady, producer));
    SHARDSCOPE_CUDA_CHECK(cudaStreamWaitEvent(m_commStream, m_inputsReady, 0));
}

comm::CommHandle NcclCommunicator::allReduceSum(const float *send, float *recv, std::size_t count)
{
    if (count == 0) return {};
    before("allReduce", send, recv);
    checkNccl(ncclApi().allReduce(send, recv, count, ncclFloat32, ncclSum,
                                  static_cast<ncclComm_t>(commPtr()), m_commStream),
              "ncclAllReduce", m_rank, static_cast<ncclComm_t>(commPtr()));
    return after();
}

double NcclCommunicator::allReduceHost(double value)
{
    before("allReduceHost", nullptr, nullptr);
    SHARDSCOPE_CUDA_CHECK(
        cudaMemcpyAsync(m_barrierBuf, &value, sizeof value, cudaMemcpyHostToDevice, m_commStream));
    checkNccl(ncclApi().allReduce(m_barrierBuf, m_barrierBuf, 1, ncclFloat64, ncclSum,
                                  static_cast<ncclComm_t>(commPtr()), m_commStream),
              "ncclAllReduce (loss)", m_rank, static_cast<ncclComm_t>(commPtr()));
    double sum = 0.0;
    SHARDSCOPE_CUDA_CHECK(
        cudaMemcpyAsync(&sum, m_barrierBuf, sizeof sum, cudaMemcpyDeviceToHost, m_commStream));
    after().wait();
    return sum;
}

void NcclCommunicator::abort() noexcept
{
    try {
        std::lock_guard lock(m_state->mutex);
        void *comm = m_state->comm.exchange(nullptr);
        if (comm) ncclApi().commAbort(static_cast<ncclComm_t>(comm));
    } catch (...) {
        // Only the mutex can throw (resource exhaustion): then another thread is aborting
        // or destroying this communicator already.
    }
}

NcclLocalWorld &NcclLocalWorld::operator=(NcclLocalWorld &&o) noexcept
{
    if (this != &o) {
        destroy();
        m_comms = std::move(o.m_comms);
    }
    return *this;
}

void NcclLocalWorld::destroy() noexcept
{
    if (m_comms.size() <= 1) {
        m_comms.clear();
        return;
    }
    std::vector<std::thread> threads;
    for (auto &c : m_comms) {
        try {
            threads.emplace_back([&c] { c.reset(); });
        } catch (...) {
            c.reset(); // no thread to spare: the destroy may then wait for its peers
        }
    }
    for (std::thread &t : threads)
        t.join();
    m_comms.clear();
}

NcclLocalWorld makeNcclLocalWorld(const std::vector<int> &devices)
{
    const NcclApi &api = requireNccl();
    int available = 0;
    SHARDSCOPE_CUDA_CHECK(cudaGetDeviceCount(&available));
    if (devices.empty()) throw comm::CommError("an NCCL world needs at least one GPU");
    for (int d : devices) {
        if (d < 0 || d >= available)
            throw comm::CommError("GPU " + std::to_string(d) +
                                  " does not exist: this machine has " + std::to_string(available) +
                                  " GPU(s); NCCL needs one GPU per rank");
    }
    std::vector<ncclComm_t> comms(devices.size(), nullptr);
    checkNccl(api.commInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()),
              "ncclCommInitAll", 0);
    std::vector<std::unique_ptr<NcclCommunicator>> out;
    std::size_t taken = 0;
    try {
        for (; taken < comms.size(); ++taken)
            out.push_back(std::make_unique<NcclCommunicator>(comms[taken], static_cast<int>(taken),
                                                             static_cast<int>(devices.size()),
                                                             devices[taken]));
    } catch (...) {
        std::vector<std::thread> threads;
        for (std::size_t i = taken; i < comms.size(); ++i)
            threads.emplace_back([&api, c = comms[i]] { api.commDestroy(c); });
        NcclLocalWorld(std::move(out)).destroy(); // concurrently with the threads above
        for (std::thread &t : threads)
            t.join();
        throw;
    }
    return NcclLocalWorld(std::move(out));
}

std::unique_ptr<NcclCommunicator> makeNcclRank(const comm::RendezvousConfig &config)
{
    const NcclApi &api = requireNccl();
    int available = 0;
    SHARDSCOPE_CUDA_CHECK(cudaGetDeviceCount(&available));
    if (config.localRank >= available)
        throw comm::CommError("LOCAL_RANK=" + std::to_string(config.localRank) +
                              " but this machine has " + std::to_string(available) +
                              " GPU(s); start at most one process per GPU on each node");
    SHARDSCOPE_CUDA_CHECK(cudaSetDevice(config.localRank));
    ncclUniqueId id{};
    std::unique_ptr<RendezvousServer> server;
    if (config.rank == 0) {
        checkNccl(api.getUniqueId(&id), "ncclGetUniqueId", 0);
        std::vector<std::byte> blob(sizeof id);
        std::memcpy(blob.data(), &id, sizeof id);
        server = std::make_unique<RendezvousServer>(config, std::move(blob));
    } else {
        const std::vector<std::byte> blob = fetchRendezvousBlob(config);
        if (blob.size() != sizeof id)
            throw comm::CommError(
                "rank " + std::to_string(config.rank) + " got a " + std::to_string(blob.size()) +
                "-byte id from rank 0 where NCCL's is " + std::to_string(sizeof id) +
                " bytes: every rank must run the same ShardScope and NCCL");
        std::memcpy(&id, blob.data(), sizeof id);
    }
    ncclComm_t comm = nullptr;
    checkNccl(api.commInitRank(&comm, config.worldSize, id, config.rank), "ncclCommInitRank",
              config.rank);
    if (server) server->wait();
    try {
        return std::make_unique<NcclCommunicator>(comm, config.rank, config.worldSize,
                                                  config.localRank);
    } catch (...) {
        api.commDestroy(comm);
        throw;
    }
}

} // namespace shardscope::comm
