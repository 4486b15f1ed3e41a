// ReduceOp validation: names, helpers, the hand-written validity table of (op, dtype) pairs and
// its messages; every invalid pair is rejected by every kernel entry point.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_kernels.h"
#include "engine/vocabulary/reduce_op.h"
#include "tests/engine/reduce_kernels_test_helpers.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;
using namespace reduce_testing;  // NOLINT: the helpers of these tests

// ---------------------------------------------------------------------------------------------
// Validation.
// ---------------------------------------------------------------------------------------------

TEST(ReduceOpTest, NamesAreTorchSpellings) {
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kSum), "SUM");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kAvg), "AVG");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kProduct), "PRODUCT");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kMin), "MIN");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kMax), "MAX");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kBand), "BAND");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kBor), "BOR");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kBxor), "BXOR");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kPremulSum), "PREMUL_SUM");
  EXPECT_EQ(ReduceOpName(static_cast<ReduceOpKind>(42)), "UNKNOWN");
}

TEST(ReduceOpTest, Helpers) {
  static_assert(ReduceOp{}.kind == ReduceOpKind::kSum);
  EXPECT_EQ(ReduceOp::Sum().kind, ReduceOpKind::kSum);
  EXPECT_EQ(ReduceOp::Avg().kind, ReduceOpKind::kAvg);
  EXPECT_EQ(ReduceOp::Product().kind, ReduceOpKind::kProduct);
  EXPECT_EQ(ReduceOp::Min().kind, ReduceOpKind::kMin);
  EXPECT_EQ(ReduceOp::Max().kind, ReduceOpKind::kMax);
  EXPECT_EQ(ReduceOp::Band().kind, ReduceOpKind::kBand);
  EXPECT_EQ(ReduceOp::Bor().kind, ReduceOpKind::kBor);
  EXPECT_EQ(ReduceOp::Bxor().kind, ReduceOpKind::kBxor);
  EXPECT_EQ(ReduceOp::PremulSum(0.25).kind, ReduceOpKind::kPremulSum);
  EXPECT_EQ(ReduceOp::PremulSum(0.25).scale, 0.25);
  EXPECT_EQ(ReduceOp::Sum().scale, 1.0);
  EXPECT_EQ(ReduceOp::PremulSum(0.25), ReduceOp::PremulSum(0.25));
  EXPECT_FALSE(ReduceOp::PremulSum(0.25) == ReduceOp::PremulSum(0.5));
  EXPECT_FALSE(ReduceOp::Sum() == ReduceOp::Avg());
}

TEST(ReduceOpTest, ValidityMatchesTheTable) {
  for (ReduceOpKind kind : kAllReduceOpKinds) {
    EXPECT_FALSE(ValidateReduceOp({kind, 1.0}, DType::kUnspecified).ok()) << ReduceOpName(kind);
    for (DType dtype : kAllDTypes) {
      EXPECT_EQ(ValidateReduceOp({kind, 1.0}, dtype).ok(), ExpectedValid(kind, dtype))
          << ReduceOpName(kind) << " on " << DTypeName(dtype);
    }
  }
}

TEST(ReduceOpTest, MessagesSayWhy) {
  EXPECT_EQ(ValidateReduceOp(ReduceOp::Band(), DType::kFloat32).message(),
            "ReduceOp BAND is not supported for dtype float32 (bitwise ops need an integer or "
            "bool dtype)");
  EXPECT_THAT(ValidateReduceOp(ReduceOp::Min(), DType::kComplex64).message(),
              HasSubstr("not ordered"));
  EXPECT_THAT(ValidateReduceOp(ReduceOp::Avg(), DType::kBool).message(),
              HasSubstr("ReduceOp AVG is not supported for dtype bool"));
  EXPECT_THAT(ValidateReduceOp(ReduceOp::PremulSum(2), DType::kInt32).message(),
              HasSubstr("ReduceOp PREMUL_SUM is not supported for dtype int32"));
  EXPECT_THAT(ValidateReduceOp(ReduceOp::Sum(), DType::kUnspecified).message(),
              HasSubstr("ReduceOp SUM is not supported for dtype unspecified"));
}

TEST(ReduceOpTest, OutOfRangeValuesAreRejectedAndShown) {
  Status bad_dtype = ValidateReduceOp(ReduceOp::Sum(), static_cast<DType>(42));
  EXPECT_TRUE(bad_dtype.IsInvalidArgument());
  EXPECT_THAT(bad_dtype.message(), HasSubstr("42"));
  EXPECT_THAT(bad_dtype.message(), HasSubstr("SUM"));
  Status bad_kind = ValidateReduceOp({static_cast<ReduceOpKind>(42), 1.0}, DType::kFloat32);
  EXPECT_TRUE(bad_kind.IsInvalidArgument());
  EXPECT_THAT(bad_kind.message(), HasSubstr("42"));
  EXPECT_THAT(bad_kind.message(), HasSubstr("float32"));
  EXPECT_FALSE(CombineFunction({static_cast<ReduceOpKind>(42), 1.0}, DType::kFloat32).ok());
  EXPECT_FALSE(CombineFunction(ReduceOp::Sum(), static_cast<DType>(-1)).ok());
}

TEST(ReduceOpTest, PremulSumScaleMustBeFinite) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                      DType::kComplex64, DType::kComplex128}) {
    for (double scale : {inf, -inf, nan}) {
      Status status = ValidateReduceOp(ReduceOp::PremulSum(scale), dtype);
      EXPECT_TRUE(status.IsInvalidArgument()) << DTypeName(dtype) << " " << scale;
      EXPECT_THAT(status.message(), HasSubstr("PREMUL_SUM"));
      EXPECT_THAT(status.message(), HasSubstr(std::string(DTypeName(dtype))));
      EXPECT_FALSE(CombineFunction(ReduceOp::PremulSum(scale), dtype).ok());
    }
    EXPECT_TRUE(ValidateReduceOp(ReduceOp::PremulSum(-3.5), dtype).ok());
    EXPECT_TRUE(ValidateReduceOp(ReduceOp::PremulSum(0.0), dtype).ok());
  }
  // Finite as a double but not as a float, the type float32-like dtypes are scaled in.
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kComplex64}) {
    EXPECT_FALSE(ValidateReduceOp(ReduceOp::PremulSum(1e300), dtype).ok()) << DTypeName(dtype);
  }
  EXPECT_TRUE(ValidateReduceOp(ReduceOp::PremulSum(1e300), DType::kFloat64).ok());
  EXPECT_TRUE(ValidateReduceOp(ReduceOp::PremulSum(1e300), DType::kComplex128).ok());
  // The scale of any other op is ignored.
  EXPECT_TRUE(ValidateReduceOp({ReduceOpKind::kSum, nan}, DType::kFloat32).ok());
}

// ---------------------------------------------------------------------------------------------
// Every invalid pair is rejected by every entry point, naming the op and the dtype.
// ---------------------------------------------------------------------------------------------

class InvalidPairTest : public ::testing::TestWithParam<Pair> {};

TEST_P(InvalidPairTest, RejectedByEveryEntryPoint) {
  const Pair pair = GetParam();
  const ReduceOp op{pair.kind, 2.0};
  const std::string op_name(ReduceOpName(pair.kind));
  const std::string dtype_name(DTypeName(pair.dtype));

  StatusOr<CombineFn> fn = CombineFunction(op, pair.dtype);
  ASSERT_FALSE(fn.ok());
  EXPECT_TRUE(fn.status().IsInvalidArgument()) << fn.status().ToString();
  EXPECT_THAT(fn.status().message(), HasSubstr(op_name));
  EXPECT_THAT(fn.status().message(), HasSubstr(dtype_name));

  Bytes data(64, 0x5a);
  const Bytes before = data;
  Status pre = PreScale(op, pair.dtype, data.data(), 4);
  EXPECT_TRUE(pre.IsInvalidArgument()) << pre.ToString();
  EXPECT_THAT(pre.message(), HasSubstr(op_name));
  EXPECT_THAT(pre.message(), HasSubstr(dtype_name));

  Status fin = Finalize(op, pair.dtype, data.data(), 4, 2);
  EXPECT_TRUE(fin.IsInvalidArgument()) << fin.ToString();
  EXPECT_THAT(fin.message(), HasSubstr(op_name));
  EXPECT_THAT(fin.message(), HasSubstr(dtype_name));
  EXPECT_EQ(data, before) << "a rejected call touched the data";
}

INSTANTIATE_TEST_SUITE_P(AllInvalidPairs, InvalidPairTest, ::testing::ValuesIn(AllPairs(false)),
                         [](const ::testing::TestParamInfo<Pair>& info) {
                           return PairName(info.param);
                         });

}  // namespace
}  // namespace collectived
