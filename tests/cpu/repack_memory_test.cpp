// A repacked weight's own pages in the model file's mapping are handed back to the kernel
// once the copy is made, so repacking does not double the weights' memory; the token table
// (looked up as well as multiplied when the output head is tied) keeps its pages; and a
// weight whose pages were handed back still reads right.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "gguf/gguf_file.hpp"
#include "support/small_model.hpp"
#include "support/test_support.hpp"

using namespace troupe;

namespace {

std::uintptr_t page_size() {
  return static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
}

// The whole pages inside a tensor's bytes, and how many of them are resident.
struct Pages {
  std::uintptr_t begin = 0, end = 0;
  std::size_t count() const { return (end - begin) / page_size(); }
};

Pages pages_of(const gguf::GgufTensorInfo& info) {
  const auto start = reinterpret_cast<std::uintptr_t>(info.data);
  const std::uintptr_t page = page_size();
  return {(start + page - 1) / page * page, (start + info.num_bytes) / page * page};
}

std::size_t resident(const Pages& p) {
  std::vector<unsigned char> flags(p.count());
  REQUIRE(mincore(reinterpret_cast<void*>(p.begin), p.end - p.begin, flags.data()) == 0);
  std::size_t n = 0;
  for (const unsigned char f : flags) n += f & 1;
  return n;
}

void touch(const gguf::GgufTensorInfo& info) {
  volatile std::uint8_t sink = 0;
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(info.data);
  for (std::size_t i = 0; i < info.num_bytes; i += 512) sink = sink + bytes[i];
}

const gguf::GgufTensorInfo& tensor(const gguf::GgufFile& file, const std::string& name) {
  for (const auto& t : file.tensors()) {
    if (t.name == name) return t;
  }
  FAIL("no tensor " << name);
  return file.tensors().front();
}

// out = x W^T through a fresh backend that loaded `info`.
std::vector<float> product(const gguf::GgufTensorInfo& info, const std::vector<float>& x) {
  cpu::CpuBackend backend(1);
  const model::Weight weight = *backend.load_weight(info);
  auto in = *backend.allocate(1, weight.cols);
  auto out = *backend.allocate(1, weight.rows);
  std::copy(x.begin(), x.end(), in.data);
  backend.matmul(in, weight, out);
  std::vector<float> result(out.data, out.data + weight.rows);
  backend.release(in);
  backend.release(out);
  return result;
}

}  // namespace

TEST_CASE("a repacked weight's file pages go back to the kernel, the token table's stay", "[cpu]") {
#ifndef MADV_PAGEOUT
  test::skip_test("this system's headers have no MADV_PAGEOUT: pages are not handed back");
#else
  {
    // Linux before 5.4 refuses the advice: nothing to check there.
    void* probe =
        mmap(nullptr, page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(probe != MAP_FAILED);
    const int advised = madvise(probe, page_size(), MADV_PAGEOUT);
    munmap(probe, page_size());
    if (advised != 0) test::skip_test("the kernel refuses MADV_PAGEOUT (Linux < 5.4)");
  }
  // F16 matrices of 1024 x 256 (512 KB each) and a tied 4096 x 256 token table.
  const std::string path = test::write_small_model("repack-pages", [](model::RandomModelSpec& s) {
    s.dim = 256;
    s.ffn_dim = 1024;
    s.vocab_size = 4096;
    s.type = gguf::TensorType::f16;
  });
  {
    // As a downloaded model's are, its pages clean: the kernel reclaims dirty ones only
    // after writing them back.
    const int fd = open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(fsync(fd) == 0);
    // and read back from the disk, not the writer's pages.
    REQUIRE(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
    close(fd);
  }
  const auto file = gguf::GgufFile::open(path);
  REQUIRE(file.has_value());
  const auto& up = tensor(*file, "blk.0.ffn_up.weight");
  const auto& table = tensor(*file, "token_embd.weight");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(256);
  for (auto& v : x) v = normal(rng);

  touch(up);
  touch(table);
  const Pages up_pages = pages_of(up), table_pages = pages_of(table);
  REQUIRE(up_pages.count() >= 100);
  REQUIRE(resident(up_pages) == up_pages.count());
  const std::vector<float> first = product(up, x);
  // Handed back: at most a few pages stay (the kernel may keep what it is busy with).
  CHECK(resident(up_pages) <= up_pages.count() / 10);
  // The table is multiplied too (the tied head) but keeps its pages for lookups.
  std::vector<float> row(256);
  for (auto& v : row) v = normal(rng);
  (void)product(table, row);
  CHECK(resident(table_pages) == table_pages.count());
  // A weight whose pages went back reads the same bits: a second backend repacks it from
  // the file again.
  const std::vector<float> again = product(up, x);
  REQUIRE(again.size() == first.size());
  CHECK(std::memcmp(again.data(), first.data(), first.size() * sizeof(float)) == 0);
#endif
}
