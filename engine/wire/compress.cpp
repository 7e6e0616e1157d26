#include "wire/compress.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <zlib.h>

namespace shardscope::wire {

namespace {

// zlib counts in uInt; larger buffers are fed in pieces of this size.
constexpr std::size_t kStep = std::size_t(1) << 30;

} // namespace

bool isGzip(std::string_view bytes)
{
    return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
           static_cast<unsigned char>(bytes[1]) == 0x8b;
}

bool wantsGzip(std::string_view path)
{
    if (path.size() < 3) return false;
    const std::string_view tail = path.substr(path.size() - 3);
    return tail[0] == '.' && std::tolower(static_cast<unsigned char>(tail[1])) == 'g' &&
           std::tolower(static_cast<unsigned char>(tail[2])) == 'z';
}

std::string gzipCompress(std::string_view text)
{
    z_stream z{};
    // 15 window bits + 16: a gzip header and trailer instead of zlib's.
    if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        throw std::bad_alloc();
    std::string out;
    out.resize(deflateBound(&z, static_cast<uLong>(std::min(text.size(), kStep))) *
                   (text.size() / kStep + 1) +
               64);
    z.next_in = reinterpret_cast<Bytef *>(const_cast<char *>(text.data()));
    std::size_t inLeft = text.size();
    std::size_t produced = 0;
    int rc = Z_OK;
    while (rc != Z_STREAM_END) {
        const std::size_t inNow = std::min(inLeft, kStep);
        z.avail_in = static_cast<uInt>(inNow);
        if (produced == out.size()) out.resize(out.size() * 2);
        const std::size_t outNow = std::min(out.size() - produced, kStep);
        z.next_out = reinterpret_cast<Bytef *>(out.data() + produced);
        z.avail_out = static_cast<uInt>(outNow);
        rc = deflate(&z, inLeft == inNow ? Z_FINISH : Z_NO_FLUSH);
        inLeft -= inNow - z.avail_in;
        produced += outNow - z.avail_out;
        if (rc == Z_STREAM_ERROR) break;
    }
    deflateEnd(&z);
    out.resize(produced);
    return out;
}

Result<std::string> gzipDecompress(std::string_view gz, std::uint64_t maxBytes)
{
    if (!isGzip(gz)) return fail("not gzip data (it does not start with 1f 8b)");
    z_stream z{};
    if (inflateInit2(&z, 15 + 16) != Z_OK) return fail("cannot start decompressing: out of memory");
    std::string out;
    // The trailer's ISIZE (the text's size mod 2^32, of the last member) sizes the buffer
    // for a single member; deflate expands at most 1032-fold, and maxBytes bounds it.
    std::uint64_t hint = 4096;
    if (gz.size() >= 18) {
        const auto *t = reinterpret_cast<const unsigned char *>(gz.data() + gz.size() - 4);
        hint = std::max<std::uint64_t>(hint, std::uint64_t(t[0]) | std::uint64_t(t[1]) << 8 |
                                                 std::uint64_t(t[2]) << 16 |
                                                 std::uint64_t(t[3]) << 24);
    }
    hint = std::min<std::uint64_t>({hint, std::uint64_t(gz.size()) * 1032 + 4096, maxBytes + 1});
    out.resize(static_cast<std::size_t>(hint));
    z.next_in = reinterpret_cast<Bytef *>(const_cast<char *>(gz.data()));
    std::size_t inLeft = gz.size();
    std::size_t produced = 0;
    std::string error;
    for (;;) {
        if (produced == out.size()) {
            if (out.size() > maxBytes) {
                error = "it decompresses to more than " + std::to_string(maxBytes >> 20) + " MiB";
                break;
            }
            out.resize(static_cast<std::size_t>(
                std::min<std::uint64_t>(maxBytes + 1, std::uint64_t(out.size()) * 2)));
        }
        const std::size_t inNow = std::min(inLeft, kStep);
        const std::size_t outNow = std::min(out.size() - produced, kStep);
        z.avail_in = static_cast<uInt>(inNow);
        z.next_out = reinterpret_cast<Bytef *>(out.data() + produced);
        z.avail_out = static_cast<uInt>(outNow);
        const int rc = inflate(&z, Z_NO_FLUSH);
        inLeft -= inNow - z.avail_in;
        produced += outNow - z.avail_out;
        if (rc == Z_STREAM_END) {
            if (inLeft == 0) break;
            // Another member follows (files joined with cat), or trailing bytes.
            if (!isGzip(std::string_view(reinterpret_cast<const char *>(z.next_in), inLeft))) {
                error = "unexpected bytes after the end of the gzip stream";
                break;
            }
            inflateReset(&z);
            continue;
        }
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR && inLeft == 0) {
            error = "the gzip stream is truncated";
            break;
        }
        if (rc == Z_BUF_ERROR && produced == out.size()) continue; // output full: grown above
        error = std::string("the gzip stream is damaged") +
                (z.msg ? std::string(" (") + z.msg + ")" : "");
        break;
    }
    inflateEnd(&z);
    if (!error.empty()) return fail(error);
    if (produced > maxBytes)
        return fail("it decompresses to more than " + std::to_string(maxBytes >> 20) + " MiB");
    out.resize(produced);
    return out;
}

} // namespace shardscope::wire
