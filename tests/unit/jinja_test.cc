#include <gtest/gtest.h>
#include "template/jinja.h"
namespace loom { namespace {
TEST(JinjaTest, Smoke) { EXPECT_EQ(JinjaTemplate("{{ x }}!").render(nlohmann::ordered_json{{"x", 1}}), "1!"); }
}}
