#include "harness/model/gguf.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "harness/model/mapped_file.h"

namespace kvbench {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr int kMaxDims = 4;
// Nested arrays are legal but no real file nests; the cap keeps hostile input off the stack.
constexpr int kMaxArrayDepth = 8;

struct TypeTraits {
  GgmlType type;
  const char* name;
  int64_t block_elements;
  int64_t block_bytes;
};

// Block layouts from ggml-common.h: QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = 32, QK_K = 256.
constexpr TypeTraits kTypeTraits[] = {
    {GgmlType::F32, "F32", 1, 4},       {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 18},   {GgmlType::Q4_1, "Q4_1", 32, 20},
    {GgmlType::Q5_0, "Q5_0", 32, 22},   {GgmlType::Q5_1, "Q5_1", 32, 24},
    {GgmlType::Q8_0, "Q8_0", 32, 34},   {GgmlType::Q4_K, "Q4_K", 256, 144},
    {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210}, {GgmlType::BF16, "BF16", 1, 2},
};

const TypeTraits* traits(GgmlType type) {
  for (const TypeTraits& t : kTypeTraits) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

const char* value_type_name(GgufValueType type) {
  static const char* const kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                       "int32",  "float32", "bool",   "string", "array",
                                       "uint64", "int64",   "float64"};
  const auto index = static_cast<uint32_t>(type);
  return index < sizeof(kNames) / sizeof(kNames[0]) ? kNames[index] : "unknown";
}

// Size in bytes of a scalar value type; 0 for string, array and unknown types.
size_t scalar_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL:
      return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
      return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32:
      return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 ||
         t == GgufValueType::UINT64;
}
bool is_signed(GgufValueType t) {
  return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
         t == GgufValueType::INT64;
}
bool is_float(GgufValueType t) {
  return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

// Bounds-checked little-endian cursor over the mapping. Every read names what it was
// reading so that a truncated file says where it broke.
class Reader {
 public:
  Reader(const std::string& path, const uint8_t* data, size_t size)
      : path_(path), data_(data), size_(size), memory_left_(size + kMemorySlack) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what) const { throw InputError(path_ + ": " + what); }

  void need(size_t n, const std::string& what) const {
    if (n > remaining()) {
      fail("truncated at byte " + std::to_string(pos_) + " while reading " + what + " (file is " +
           std::to_string(size_) + " bytes)");
    }
  }

  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string read_string(const std::string& what) {
    const uint64_t length = read<uint64_t>(what + " length");
    if (length > remaining()) {
      fail("truncated at byte " + std::to_string(pos_) + " while reading " + what +
           " (string length " + std::to_string(length) + ", file is " + std::to_string(size_) +
           " bytes)");
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(length));
    pos_ += static_cast<size_t>(length);
    return s;
  }

  void skip(size_t n, const std::string& what) {
    need(n, what);
    pos_ += n;
  }

  // An element count is absurd when even the smallest encoding of that many elements
  // would not fit in what is left of the file; checked before anything is allocated.
  void check_count(uint64_t count, size_t min_element_bytes, const std::string& what) const {
    if (min_element_bytes != 0 && count > remaining() / min_element_bytes) {
      fail("truncated or corrupt at byte " + std::to_string(pos_) + ": " + what + " count " +
           std::to_string(count) + " needs at least " + std::to_string(min_element_bytes) +
           " bytes each but only " + std::to_string(remaining()) + " bytes are left (file is " +
           std::to_string(size_) + " bytes)");
    }
  }

  // What the metadata and tensor table hold in memory is charged against the file's own
  // size: an element may take more room in memory than in the file (a uint8 read into a
  // uint64 vector, an empty string into a std::string), so a corrupted count that passes
  // check_count could still ask for several times the file. Real files spend a few percent.
  void charge(uint64_t count, size_t bytes_each, const std::string& what) {
    if (bytes_each != 0 && count > memory_left_ / bytes_each) {
      fail("corrupt at byte " + std::to_string(pos_) + ": " + what + " count " +
           std::to_string(count) + " would hold more in memory than the file's " +
           std::to_string(size_) + " bytes");
    }
    memory_left_ -= count * bytes_each;
  }

 private:
  static constexpr size_t kMemorySlack = size_t{1} << 20;  // room for tiny test files

  const std::string& path_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  size_t memory_left_;
};

uint64_t read_unsigned(Reader& r, GgufValueType t, const std::string& what) {
  switch (t) {
    case GgufValueType::UINT8:
      return r.read<uint8_t>(what);
    case GgufValueType::UINT16:
      return r.read<uint16_t>(what);
    case GgufValueType::UINT32:
      return r.read<uint32_t>(what);
    default:
      return r.read<uint64_t>(what);
  }
}

int64_t read_signed(Reader& r, GgufValueType t, const std::string& what) {
  switch (t) {
    case GgufValueType::INT8:
      return r.read<int8_t>(what);
    case GgufValueType::INT16:
      return r.read<int16_t>(what);
    case GgufValueType::INT32:
      return r.read<int32_t>(what);
    default:
      return r.read<int64_t>(what);
  }
}

double read_float(Reader& r, GgufValueType t, const std::string& what) {
  if (t == GgufValueType::FLOAT32) return r.read<float>(what);
  return r.read<double>(what);
}

bool read_bool(Reader& r, const std::string& what) {
  const uint8_t b = r.read<uint8_t>(what);
  if (b > 1) {
    r.fail("bool value " + std::to_string(b) + " at byte " + std::to_string(r.pos() - 1) +
           " while reading " + what + " (expected 0 or 1)");
  }
  return b != 0;
}

GgufValueType read_value_type(Reader& r, const std::string& what) {
  const uint32_t raw = r.read<uint32_t>(what + " type");
  if (raw > static_cast<uint32_t>(GgufValueType::FLOAT64)) {
    r.fail("unknown value type " + std::to_string(raw) + " at byte " + std::to_string(r.pos() - 4) +
           " while reading " + what + " (expected 0..12)");
  }
  return static_cast<GgufValueType>(raw);
}

// Walks past an array whose elements are themselves arrays; their contents are not kept.
void skip_array(Reader& r, int depth, const std::string& what) {
  if (depth > kMaxArrayDepth) {
    r.fail("arrays nested deeper than " + std::to_string(kMaxArrayDepth) +
           " levels while reading " + what);
  }
  const GgufValueType elem = read_value_type(r, what + " element");
  const uint64_t count = r.read<uint64_t>(what + " element count");
  if (elem == GgufValueType::STRING) {
    r.check_count(count, 8, what);
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t length = r.read<uint64_t>(what + " string length");
      r.check_count(length, 1, what + " string");
      r.skip(static_cast<size_t>(length), what + " string");
    }
  } else if (elem == GgufValueType::ARRAY) {
    r.check_count(count, 12, what);
    for (uint64_t i = 0; i < count; ++i) skip_array(r, depth + 1, what);
  } else {
    const size_t size = scalar_size(elem);
    r.check_count(count, size, what);
    r.skip(static_cast<size_t>(count) * size, what);
  }
}

GgufValue read_array(Reader& r, const std::string& what) {
  GgufValue v;
  v.type = GgufValueType::ARRAY;
  v.array_type = read_value_type(r, what + " element");
  const GgufValueType elem = v.array_type;
  const uint64_t count = r.read<uint64_t>(what + " element count");
  const size_t min_size = elem == GgufValueType::STRING  ? 8
                          : elem == GgufValueType::ARRAY ? 12
                                                         : scalar_size(elem);
  r.check_count(count, min_size, what);
  const size_t n = static_cast<size_t>(count);
  r.charge(count,
           elem == GgufValueType::STRING ? sizeof(std::string)
           : elem == GgufValueType::BOOL || elem == GgufValueType::ARRAY ? 0
                                                                         : sizeof(uint64_t),
           what);
  if (is_unsigned(elem)) {
    std::vector<uint64_t> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = read_unsigned(r, elem, what);
    v.value = std::move(out);
  } else if (is_signed(elem)) {
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = read_signed(r, elem, what);
    v.value = std::move(out);
  } else if (is_float(elem)) {
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = read_float(r, elem, what);
    v.value = std::move(out);
  } else if (elem == GgufValueType::BOOL) {
    std::vector<bool> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = read_bool(r, what);
    v.value = std::move(out);
  } else if (elem == GgufValueType::STRING) {
    std::vector<std::string> out;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      out.push_back(r.read_string(what + " element"));
      r.charge(out.back().size(), 1, what);
    }
    v.value = std::move(out);
  } else {
    // Arrays of arrays: walked and checked, kept as an empty list.
    for (size_t i = 0; i < n; ++i) skip_array(r, 2, what);
    v.value = std::vector<uint64_t>{};
  }
  return v;
}

GgufValue read_value(Reader& r, GgufValueType type, const std::string& what) {
  GgufValue v;
  v.type = type;
  if (is_unsigned(type)) {
    v.value = read_unsigned(r, type, what);
  } else if (is_signed(type)) {
    v.value = read_signed(r, type, what);
  } else if (is_float(type)) {
    v.value = read_float(r, type, what);
  } else if (type == GgufValueType::BOOL) {
    v.value = read_bool(r, what);
  } else if (type == GgufValueType::STRING) {
    v.value = r.read_string(what);
  } else {
    v = read_array(r, what);
  }
  return v;
}

// Names come from the file, so they are escaped and shortened to keep the message one line.
std::string quoted(const std::string& s) {
  constexpr size_t kMaxShown = 120;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMaxShown) out += "...";
  return out + "'";
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* ggml_type_name(GgmlType type) {
  const TypeTraits* t = traits(type);
  return t != nullptr ? t->name : "unknown";
}

bool ggml_type_supported(GgmlType type) { return traits(type) != nullptr; }

int64_t ggml_block_elements(GgmlType type) {
  const TypeTraits* t = traits(type);
  return t != nullptr ? t->block_elements : 0;
}

int64_t ggml_block_bytes(GgmlType type) {
  const TypeTraits* t = traits(type);
  return t != nullptr ? t->block_bytes : 0;
}

int64_t ggml_row_bytes(GgmlType type, int64_t n) {
  const TypeTraits* t = traits(type);
  if (t == nullptr) return 0;
  return n / t->block_elements * t->block_bytes;
}

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t GgufTensorInfo::n_bytes() const { return ggml_row_bytes(type, n_elements()); }

GgufFile::GgufFile(const std::string& path) : path_(path) {
  auto file = std::make_shared<const MappedFile>(path, "a GGUF file");
  const MappedFile& mapping = *file;
  owned_.push_back(file);
  const uint8_t* base = mapping.data();
  Reader r(path_, base, mapping.size());

  const uint32_t magic = r.read<uint32_t>("the magic");
  if (magic != kGgufMagic) {
    r.fail("bad magic (expected 'GGUF' at byte 0); not a GGUF file");
  }
  version_ = r.read<uint32_t>("the version");
  if (version_ == 1) {
    r.fail("GGUF version 1 is not supported (expected version 2 or 3); re-convert the model");
  }
  if (version_ != 2 && version_ != 3) {
    r.fail("unsupported GGUF version " + std::to_string(version_) + " (expected 2 or 3)");
  }
  const uint64_t n_tensors = r.read<uint64_t>("the tensor count");
  const uint64_t n_kv = r.read<uint64_t>("the metadata count");
  // Smallest encodings: key (8-byte length) + type (4) + 1-byte value; tensor info is a
  // name length (8) + n_dims (4) + type (4) + offset (8).
  r.check_count(n_kv, 13, "metadata");
  r.check_count(n_tensors, 24, "tensor");

  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string what = "metadata key " + std::to_string(i);
    std::string key = r.read_string(what);
    r.charge(1, sizeof(std::string) + sizeof(GgufValue) + 64 + key.size(), what);  // map node
    const std::string value_what = "metadata " + quoted(key);
    const GgufValueType type = read_value_type(r, value_what);
    GgufValue value = read_value(r, type, value_what);
    if (!metadata_.emplace(key, std::move(value)).second) {
      r.fail("duplicate metadata key " + quoted(key) + " (expected each key once)");
    }
  }

  auto it = metadata_.find("general.alignment");
  if (it != metadata_.end()) {
    const GgufValue& v = it->second;
    const uint64_t* a = std::get_if<uint64_t>(&v.value);
    if (v.type != GgufValueType::UINT32 || a == nullptr || *a == 0 || (*a & (*a - 1)) != 0) {
      r.fail("general.alignment must be a uint32 power of two");
    }
    alignment_ = *a;
  }

  // A tensor's info and its index entry, as held (name characters charged on top).
  constexpr size_t kTensorEntryBytes = sizeof(GgufTensorInfo) + 64;
  r.charge(n_tensors, kTensorEntryBytes, "tensor");
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string what = "tensor info " + std::to_string(i);
    GgufTensorInfo info;
    info.name = r.read_string(what);
    r.charge(2 * info.name.size(), 1, what);  // the info's copy and the index's
    const std::string named = what + " (" + quoted(info.name) + ")";
    const uint32_t n_dims = r.read<uint32_t>(what);
    if (n_dims > kMaxDims) {
      r.fail(named + " has " + std::to_string(n_dims) + " dimensions (expected at most 4)");
    }
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const int64_t ne = r.read<int64_t>(what);
      if (ne < 0) {
        r.fail(named + " has negative dimension " + std::to_string(ne));
      }
      if (ne != 0 && n_elements > std::numeric_limits<int64_t>::max() / ne) {
        r.fail(named + " has more elements than fit in int64");
      }
      n_elements *= ne;
      info.shape.push_back(ne);
    }
    const uint32_t raw_type = r.read<uint32_t>(what);
    info.type = static_cast<GgmlType>(raw_type);
    if (!ggml_type_supported(info.type)) {
      r.fail("tensor " + quoted(info.name) + " has unsupported type " + std::to_string(raw_type) +
             " (expected F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K)");
    }
    const int64_t block = ggml_block_elements(info.type);
    const int64_t row = info.shape.empty() ? 1 : info.shape[0];
    if (row % block != 0) {
      r.fail("tensor " + quoted(info.name) + " of type " + ggml_type_name(info.type) +
             " has row length " + std::to_string(row) + " (expected a multiple of " +
             std::to_string(block) + ")");
    }
    if (n_elements / block > std::numeric_limits<int64_t>::max() / ggml_block_bytes(info.type)) {
      r.fail(named + " is too large");
    }
    info.offset = r.read<uint64_t>(what);
    if (info.offset % alignment_ != 0) {
      r.fail("tensor " + quoted(info.name) + " data offset " + std::to_string(info.offset) +
             " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    if (!tensor_index_.emplace(info.name, tensors_.size()).second) {
      r.fail("duplicate tensor name " + quoted(info.name) + " (expected each name once)");
    }
    tensors_.push_back(std::move(info));
  }

  // The data section starts at the next multiple of the alignment after the tensor table.
  const uint64_t header_end = r.pos();
  const uint64_t data_start = (header_end + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t file_size = mapping.size();
  for (GgufTensorInfo& info : tensors_) {
    const auto n_bytes = static_cast<uint64_t>(info.n_bytes());
    const bool fits = data_start <= file_size && info.offset <= file_size - data_start &&
                      n_bytes <= file_size - data_start - info.offset;
    if (!fits) {
      r.fail("tensor " + quoted(info.name) + " data [" + std::to_string(info.offset) + ", +" +
             std::to_string(n_bytes) + ") from data section at byte " + std::to_string(data_start) +
             " runs past the end of the file (file is " + std::to_string(file_size) + " bytes)");
    }
    info.data = base + data_start + info.offset;
  }
}

GgufFile::GgufFile(std::string path, std::map<std::string, GgufValue> metadata,
                   std::vector<GgufTensorInfo> tensors, std::vector<std::shared_ptr<const void>> owned)
    : path_(std::move(path)),
      version_(3),
      metadata_(std::move(metadata)),
      tensors_(std::move(tensors)),
      owned_(std::move(owned)) {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensor_index_.emplace(tensors_[i].name, i).second) {
      throw InputError(path_ + ": tensor '" + tensors_[i].name + "' given twice");
    }
  }
}

GgufFile::~GgufFile() = default;

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (t == nullptr) throw InputError(path_ + ": tensor " + quoted(name) + " not found");
  return *t;
}

namespace {

[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const GgufValue& v,
                             const char* expected) {
  std::string got = value_type_name(v.type);
  if (v.type == GgufValueType::ARRAY) got += std::string(" of ") + value_type_name(v.array_type);
  throw InputError(path + ": metadata " + quoted(key) + " is " + got + " (expected " + expected +
                   ")");
}

const GgufValue& lookup(const std::string& path, const std::map<std::string, GgufValue>& metadata,
                        const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) throw InputError(path + ": metadata " + quoted(key) + " not found");
  return it->second;
}

int64_t to_int64(const std::string& path, const std::string& key, uint64_t u) {
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw InputError(path + ": metadata " + quoted(key) + " value " + std::to_string(u) +
                     " does not fit in int64");
  }
  return static_cast<int64_t>(u);
}

}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = lookup(path_, metadata_, key);
  const auto* s = std::get_if<std::string>(&v.value);
  if (s == nullptr) wrong_type(path_, key, v, "string");
  return *s;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = lookup(path_, metadata_, key);
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return to_int64(path_, key, *u);
  if (const auto* s = std::get_if<int64_t>(&v.value)) return *s;
  wrong_type(path_, key, v, "an integer");
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = lookup(path_, metadata_, key);
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return static_cast<double>(*u);
  if (const auto* s = std::get_if<int64_t>(&v.value)) return static_cast<double>(*s);
  wrong_type(path_, key, v, "a number");
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = lookup(path_, metadata_, key);
  const auto* b = std::get_if<bool>(&v.value);
  if (b == nullptr) wrong_type(path_, key, v, "bool");
  return *b;
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = lookup(path_, metadata_, key);
  const auto* a = std::get_if<std::vector<std::string>>(&v.value);
  if (a == nullptr) wrong_type(path_, key, v, "array of string");
  return *a;
}

// Arrays of arrays are stored as an empty uint64 list, so the element type is checked too.
std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = lookup(path_, metadata_, key);
  if (const auto* s = std::get_if<std::vector<int64_t>>(&v.value)) return *s;
  const auto* u = std::get_if<std::vector<uint64_t>>(&v.value);
  if (u == nullptr || !is_unsigned(v.array_type)) wrong_type(path_, key, v, "array of integers");
  std::vector<int64_t> out;
  out.reserve(u->size());
  for (uint64_t x : *u) out.push_back(to_int64(path_, key, x));
  return out;
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = lookup(path_, metadata_, key);
  if (const auto* d = std::get_if<std::vector<double>>(&v.value)) return *d;
  if (const auto* s = std::get_if<std::vector<int64_t>>(&v.value)) {
    return std::vector<double>(s->begin(), s->end());
  }
  const auto* u = std::get_if<std::vector<uint64_t>>(&v.value);
  if (u == nullptr || !is_unsigned(v.array_type)) wrong_type(path_, key, v, "array of numbers");
  return std::vector<double>(u->begin(), u->end());
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

}  // namespace kvbench
