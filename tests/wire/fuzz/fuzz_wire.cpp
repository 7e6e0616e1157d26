// libFuzzer entry point for the frame, message and snapshot decoders (clang only).
// Build: CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DSHARDSCOPE_BUILD_GUI=OFF
//        cmake --build build-fuzz --target fuzz_wire && build-fuzz/bin/fuzz_wire -max_total_time=60

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "../fuzzinput.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size)
{
    const std::string_view bytes(reinterpret_cast<const char *>(data), size);
    (void)shardscope::test::decodeEverything(bytes, 1u << 16, size > 0 ? 1 + data[0] % 64 : 1);
    (void)shardscope::test::decodeJsonDocuments(bytes);
    return 0;
}
