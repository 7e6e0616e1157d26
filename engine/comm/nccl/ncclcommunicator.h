#pragma once
// The NCCL backend of Communicator: collectives on device buffers, enqueued on a
// dedicated communication stream; each returns a CommHandle that completes on a CUDA
// event recorded behind it. memory() is the rank's GPU (comm/nccl/cudamemory.h), so an
// Engine keeps this rank's shards and gathered tensors there.
//
// Ordering with compute: by default (standalone use) every collective first waits, on
// the device, for the work queued on the compute stream. The Engine instead orders its
// collectives itself with waitForCompute(), so that a prefetch does not wait for
// unrelated compute: engine communicators are made with setOrderAfterCompute(false) and
// their own non-blocking compute stream (useOwnComputeStream), as makeNcclEngine does.

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl/cudamemory.h"
#include "comm/tcprendezvous.h"

namespace shardscope::comm {

class NcclCommunicator final : public comm::Communicator
{
  public:
    // Takes ownership of comm (an ncclComm_t) for rank of worldSize on CUDA device.
    NcclCommunicator(void *ncclComm, int rank, int worldSize, int device);
    ~NcclCommunicator() override;
    NcclCommunicator(const NcclCommunicator &) = delete;
    NcclCommunicator &operator=(const NcclCommunicator &) = delete;

    int rank() const override { return m_rank; }
    int worldSize() const override { return m_world; }
    comm::Backend backend() const override { return comm::Backend::Nccl; }
    bool deviceBuffers() const override { return true; }
    comm::MemorySpace &memory() override { return *m_memory; }
    // The communication stream waits (on the device) for the compute stream's work so far.
    void waitForCompute() override { commWaitFor(m_computeStream); }
    void bindThread() override; // cudaSetDevice(device())

    comm::CommHandle allGather(const void *send, void *recv, std::size_t bytes) override;
    comm::CommHandle broadcast(void *buf, std::size_t bytes, int root) override;
    // Sums in NCCL's order (ring/tree), which is deterministic for a fixed world and
    // topology but not the CPU backend's rank order: results agree to fp rounding.
    comm::CommHandle reduceScatter(const void *send, void *recv, std::size_t count,
                                   DType dtype) override;
    void barrier() override;

    int device() const { return m_device; }
    cudaStream_t commStream() const { return m_commStream; }
    // The stream the rank's kernels and memory() operations run on (default: the legacy
    // default stream). With orderAfterCompute (the default) collectives start after
    // everything already enqueued on it, so inputs written by compute kernels are complete.
    void setComputeStream(cudaStream_t stream);
    cudaStream_t computeStream() const { return m_computeStream; }
    // Creates a non-blocking stream on device(), owned by this communicator (destroyed
    // with it), and makes it the compute stream. Returns it.
    cudaStream_t useOwnComputeStream();
    // false: collectives do not wait for the compute stream; the caller orders them
    // itself with waitForCompute()/commWaitFor (the Engine does, so prefetches overlap
    // compute). Must be false for a communicator given to an Engine.
    void setOrderAfterCompute(bool on) { m_orderAfterCompute = on; }
    bool orderAfterCompute() const { return m_orderAfterCompute; }
    // Makes stream wait (on the device, without blocking the host) for every collective
    // enqueued so far: how compute kernels consume results without a host sync.
    void streamWaitComm(cudaStream_t stream);
    // Makes the communication stream wait for the work enqueued so far on producer.
    void commWaitFor(cudaStream_t producer);
    // recv (count floats) = element-wise sum over ranks of send; an all-reduce for the
    // parameters that are not partitioned.
    comm::CommHandle allReduceSum(const float *send, float *recv, std::size_t count);
    // The sum over ranks of one host value (synchronous; the per-step loss).
    double allReduceHost(double value);
    // ncclCommAbort: unblocks ranks waiting on a collective that will never complete
    // because another rank failed. Callable from any thread; the communicator is unusable after.
    void abort() noexcept override;

  private:
    void before(const char *what, const void *a, const void *b);
    // Waits for the collectives on the communication stream; aborts the communicator if
    // NCCL reports an asynchronous error meanwhile (a peer died), instead of hanging.
    void drainCommStream() noexcept;
    comm::CommHandle after();
    // The ncclComm_t, shared with the handles so that wait() can ask NCCL for
    // asynchronous errors; the mutex keeps abort/destroy from freeing it meanwhile.
    struct CommState
    {
        std::mutex mutex;
        std::atomic<void *> comm{nullptr};
    };
    void *commPtr() const { return m_state->comm.load(); }
    std::shared_ptr<CommState> m_state = std::make_shared<CommState>();
    int m_rank = 0;
    int m_world = 1;
    int m_device = 0;
    cudaStream_t m_commStream = nullptr;
    cudaStream_t m_computeStream = nullptr;
    cudaStream_t m_ownComputeStream = nullptr;
    std::unique_ptr<comm::CudaMemory> m_memory;
    bool m_orderAfterCompute = true;
    cudaEvent_t m_inputsReady = nullptr;
    cudaEvent_t m_lastDone = nullptr;
    void *m_barrierBuf = nullptr; // one double: barrier and allReduceHost
};

// The communicators of one process's ranks. ncclCommDestroy is an intra-node collective,
// so the destructor destroys them from one thread each (one thread destroying them in
// turn would wait forever on the first).
class NcclLocalWorld
{
  public:
    NcclLocalWorld() = default;
    explicit NcclLocalWorld(std::vector<std::unique_ptr<NcclCommunicator>> comms)
        : m_comms(std::move(comms))
    {
    }
    ~NcclLocalWorld() { destroy(); }
    NcclLocalWorld(NcclLocalWorld &&o) noexcept : m_comms(std::move(o.m_comms)) {}
    NcclLocalWorld &operator=(NcclLocalWorld &&o) noexcept;
    NcclLocalWorld(const NcclLocalWorld &) = delete;
    NcclLocalWorld &operator=(const NcclLocalWorld &) = delete;

    std::size_t size() const { return m_comms.size(); }
    // Hands the communicators over (to an Engine, which then destroys them, one thread
    // each); this world is empty afterwards and destroys nothing.
    std::vector<std::unique_ptr<NcclCommunicator>> release() { return std::exchange(m_comms, {}); }
    NcclCommunicator &operator[](std::size_t i) const { return *m_comms[i]; }
    NcclCommunicator &front() const { return *m_comms.front(); }
    void destroy() noexcept;

  private:
    std::vector<std::unique_ptr<NcclCommunicator>> m_comms;
};

// One process driving the given local GPUs, one rank per GPU (rank i on devices[i]),
// created together with ncclCommInitAll. Each communicator is then used by one thread.
NcclLocalWorld makeNcclLocalWorld(const std::vector<int> &devices);

// One rank of a multi-process (or multi-node) world: device = config.localRank; rank 0
// creates the ncclUniqueId and serves it at MASTER_ADDR:MASTER_PORT, the others fetch it.
std::unique_ptr<NcclCommunicator> makeNcclRank(const comm::RendezvousConfig &config);

} // namespace shardscope::comm
