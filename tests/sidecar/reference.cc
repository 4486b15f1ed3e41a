#include "tests/sidecar/reference.h"

#include <cmath>
#include <cstring>
#include <sstream>

namespace collectived::sidecar_test {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One of {-2, -1.5, -1, -0.5, 0.5, 1, 1.5, 2}.
double SmallNonZero(uint64_t h) {
  int k = static_cast<int>(h % 8) - 4;  // -4..3
  if (k >= 0) ++k;                      // -4..-1, 1..4
  return 0.5 * k;
}

bool IsRealFloat(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32;
}

double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 2e-3;
    case DType::kBFloat16:
      return 1.6e-2;
    default:
      return 1e-5;
  }
}

}  // namespace

const std::vector<DType>& MatrixDTypes() {
  static const std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                            DType::kInt64,   DType::kBool,    DType::kComplex64};
  return dtypes;
}

std::vector<ReduceOp> ApplicableOps(DType dtype) {
  const ReduceOp premul = ReduceOp::PremulSum(kPremulScale);
  if (IsRealFloat(dtype)) {
    return {ReduceOp::Sum(), ReduceOp::Avg(), ReduceOp::Product(),
            ReduceOp::Min(), ReduceOp::Max(), premul};
  }
  if (dtype == DType::kComplex64) {
    return {ReduceOp::Sum(), ReduceOp::Avg(), ReduceOp::Product(), premul};
  }
  if (dtype == DType::kInt64) {
    return {ReduceOp::Sum(), ReduceOp::Avg(),  ReduceOp::Product(), ReduceOp::Min(),
            ReduceOp::Max(), ReduceOp::Band(), ReduceOp::Bor(),     ReduceOp::Bxor()};
  }
  if (dtype == DType::kBool) {
    return {ReduceOp::Sum(),  ReduceOp::Product(), ReduceOp::Min(), ReduceOp::Max(),
            ReduceOp::Band(), ReduceOp::Bor(),     ReduceOp::Bxor()};
  }
  return {};
}

std::vector<ReduceOp> InapplicableOps(DType dtype) {
  std::vector<ReduceOp> applicable = ApplicableOps(dtype);
  std::vector<ReduceOp> others;
  for (ReduceOpKind kind : kAllReduceOpKinds) {
    bool found = false;
    for (const ReduceOp& op : applicable) found = found || op.kind == kind;
    if (!found) {
      others.push_back(kind == ReduceOpKind::kPremulSum ? ReduceOp::PremulSum(kPremulScale)
                                                        : ReduceOp{kind});
    }
  }
  return others;
}

Value Generate(DType dtype, uint64_t seed, int rank, size_t index) {
  const uint64_t h = Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(rank)) ^ index);
  Value v;
  if (IsRealFloat(dtype)) {
    v.z = SmallNonZero(h);
  } else if (dtype == DType::kComplex64) {
    v.z = {SmallNonZero(h), SmallNonZero(h >> 8)};
  } else if (dtype == DType::kInt64) {
    int64_t small = static_cast<int64_t>(h % 201) - 100;
    v.i = (h >> 16) % 3 == 0 ? small * (int64_t{1} << 35) + static_cast<int64_t>((h >> 24) % 7)
                             : small;
  } else {
    v.b = (h >> 4) % 3 != 0;
  }
  return v;
}

std::vector<Value> GenerateTensor(DType dtype, uint64_t seed, int rank, size_t count) {
  std::vector<Value> values;
  for (size_t i = 0; i < count; ++i) values.push_back(Generate(dtype, seed, rank, i));
  return values;
}

std::vector<std::byte> Encode(DType dtype, const std::vector<Value>& values) {
  const size_t size = DTypeSize(dtype);
  std::vector<std::byte> bytes(values.size() * size);
  for (size_t i = 0; i < values.size(); ++i) {
    std::byte* out = bytes.data() + i * size;
    const Value& v = values[i];
    switch (dtype) {
      case DType::kFloat32: {
        float f = static_cast<float>(v.z.real());
        std::memcpy(out, &f, 4);
        break;
      }
      case DType::kFloat16: {
        uint16_t h = FloatToHalf(static_cast<float>(v.z.real()));
        std::memcpy(out, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        uint16_t h = FloatToBFloat16(static_cast<float>(v.z.real()));
        std::memcpy(out, &h, 2);
        break;
      }
      case DType::kComplex64: {
        float parts[2] = {static_cast<float>(v.z.real()), static_cast<float>(v.z.imag())};
        std::memcpy(out, parts, 8);
        break;
      }
      case DType::kInt64:
        std::memcpy(out, &v.i, 8);
        break;
      case DType::kBool:
        out[0] = std::byte{static_cast<unsigned char>(v.b ? 1 : 0)};
        break;
      default:
        break;
    }
  }
  return bytes;
}

std::vector<Value> Decode(DType dtype, const std::vector<std::byte>& bytes) {
  const size_t size = DTypeSize(dtype);
  std::vector<Value> values(bytes.size() / size);
  for (size_t i = 0; i < values.size(); ++i) {
    const std::byte* in = bytes.data() + i * size;
    Value& v = values[i];
    switch (dtype) {
      case DType::kFloat32: {
        float f;
        std::memcpy(&f, in, 4);
        v.z = f;
        break;
      }
      case DType::kFloat16: {
        uint16_t h;
        std::memcpy(&h, in, 2);
        v.z = HalfToFloat(h);
        break;
      }
      case DType::kBFloat16: {
        uint16_t h;
        std::memcpy(&h, in, 2);
        v.z = BFloat16ToFloat(h);
        break;
      }
      case DType::kComplex64: {
        float parts[2];
        std::memcpy(parts, in, 8);
        v.z = {parts[0], parts[1]};
        break;
      }
      case DType::kInt64:
        std::memcpy(&v.i, in, 8);
        break;
      case DType::kBool:
        // Any other byte than 0 or 1 is a wrong result; keep it visible.
        v.b = in[0] != std::byte{0};
        v.i = static_cast<int64_t>(in[0]);
        break;
      default:
        break;
    }
  }
  return values;
}

Value ReduceReference(DType dtype, const ReduceOp& op, const std::vector<Value>& in) {
  const double n = static_cast<double>(in.size());
  Value out;
  if (dtype == DType::kBool) {
    bool any = false, all = true, parity = false;
    for (const Value& v : in) {
      any = any || v.b;
      all = all && v.b;
      parity = parity != v.b;
    }
    switch (op.kind) {
      case ReduceOpKind::kSum:
      case ReduceOpKind::kMax:
      case ReduceOpKind::kBor:
        out.b = any;
        break;
      case ReduceOpKind::kProduct:
      case ReduceOpKind::kMin:
      case ReduceOpKind::kBand:
        out.b = all;
        break;
      default:  // kBxor
        out.b = parity;
    }
    out.i = out.b ? 1 : 0;
    return out;
  }
  if (dtype == DType::kInt64) {
    uint64_t sum = 0, product = 1, band = ~uint64_t{0}, bor = 0, bxor = 0;
    int64_t lo = in[0].i, hi = in[0].i;
    for (const Value& v : in) {
      const uint64_t u = static_cast<uint64_t>(v.i);
      sum += u;
      product *= u;
      band &= u;
      bor |= u;
      bxor ^= u;
      lo = std::min(lo, v.i);
      hi = std::max(hi, v.i);
    }
    switch (op.kind) {
      case ReduceOpKind::kSum:
        out.i = static_cast<int64_t>(sum);
        break;
      case ReduceOpKind::kAvg:  // C++ division truncates toward zero, like NCCL's integer AVG
        out.i = static_cast<int64_t>(sum) / static_cast<int64_t>(in.size());
        break;
      case ReduceOpKind::kProduct:
        out.i = static_cast<int64_t>(product);
        break;
      case ReduceOpKind::kMin:
        out.i = lo;
        break;
      case ReduceOpKind::kMax:
        out.i = hi;
        break;
      case ReduceOpKind::kBand:
        out.i = static_cast<int64_t>(band);
        break;
      case ReduceOpKind::kBor:
        out.i = static_cast<int64_t>(bor);
        break;
      default:  // kBxor
        out.i = static_cast<int64_t>(bxor);
    }
    return out;
  }
  std::complex<double> sum = 0, product = 1;
  double lo = in[0].z.real(), hi = in[0].z.real();
  for (const Value& v : in) {
    sum += v.z;
    product *= v.z;
    lo = std::min(lo, v.z.real());
    hi = std::max(hi, v.z.real());
  }
  switch (op.kind) {
    case ReduceOpKind::kSum:
      out.z = sum;
      break;
    case ReduceOpKind::kAvg:
      out.z = sum / n;
      break;
    case ReduceOpKind::kProduct:
      out.z = product;
      break;
    case ReduceOpKind::kMin:
      out.z = lo;
      break;
    case ReduceOpKind::kMax:
      out.z = hi;
      break;
    default:  // kPremulSum
      out.z = sum * op.scale;
  }
  return out;
}

std::vector<Value> ReduceReference(DType dtype, const ReduceOp& op,
                                   const std::vector<std::vector<Value>>& contributions) {
  std::vector<Value> out;
  for (size_t i = 0; i < contributions[0].size(); ++i) {
    std::vector<Value> column;
    for (const auto& c : contributions) column.push_back(c[i]);
    out.push_back(ReduceReference(dtype, op, column));
  }
  return out;
}

bool Matches(DType dtype, const Value& got, const Value& expected) {
  if (dtype == DType::kInt64) return got.i == expected.i;
  if (dtype == DType::kBool) return got.i == (expected.b ? 1 : 0);
  const double tolerance = Tolerance(dtype);
  auto close = [&](double a, double e) {
    if (std::isnan(a) || std::isnan(e)) return false;
    return std::abs(a - e) <= tolerance * std::max(1.0, std::abs(e));
  };
  return close(got.z.real(), expected.z.real()) && close(got.z.imag(), expected.z.imag());
}

std::string Describe(DType dtype, const Value& value) {
  std::ostringstream text;
  if (dtype == DType::kInt64) {
    text << value.i;
  } else if (dtype == DType::kBool) {
    text << (value.i > 1 ? "byte " + std::to_string(value.i) : value.b ? "true" : "false");
  } else if (dtype == DType::kComplex64) {
    text << value.z.real() << (value.z.imag() < 0 ? "" : "+") << value.z.imag() << "i";
  } else {
    text << value.z.real();
  }
  return text.str();
}

std::string OpName(const ReduceOp& op) {
  return std::string(ReduceOpName(op.kind));
}

std::string CompareValues(DType dtype, const std::vector<Value>& got,
                          const std::vector<Value>& expected) {
  if (got.size() != expected.size()) {
    return "got " + std::to_string(got.size()) + " elements, expected " +
           std::to_string(expected.size());
  }
  std::string text;
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (Matches(dtype, got[i], expected[i])) continue;
    if (++mismatches <= 4) {
      text += " [" + std::to_string(i) + "] got " + Describe(dtype, got[i]) + " expected " +
              Describe(dtype, expected[i]) + ";";
    }
  }
  if (mismatches == 0) return "";
  return std::to_string(mismatches) + " of " + std::to_string(got.size()) +
         " elements differ:" + text;
}

}  // namespace collectived::sidecar_test
