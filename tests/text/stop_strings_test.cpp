#include <catch2/catch.hpp>

#include "text/stop_strings.hpp"

using namespace troupe::text;

TEST_CASE("text streams through until a stop string, which is cut", "[stop]") {
  StopStringFilter f({"\n\n", "END"});
  CHECK(f.push("Hello") == "Hello");
  CHECK(f.push(" wor") == " wor");
  CHECK(f.push("ld E") == "ld ");  // "E" may start "END": held
  CHECK(f.push("N") == "");
  CHECK(f.push("Dless") == "");
  CHECK(f.stopped());
  CHECK(f.matched() == "END");
  CHECK(f.push("more") == "");
}

TEST_CASE("a false start is released when it stops matching", "[stop]") {
  StopStringFilter f({"STOP"});
  CHECK(f.push("ST") == "");
  CHECK(f.push("AR") == "STAR");
  CHECK(f.push("S") == "");
  CHECK(f.flush() == "S");
  CHECK_FALSE(f.stopped());
}

TEST_CASE("a stop string split across many tokens is found", "[stop]") {
  StopStringFilter f({"</answer>"});
  std::string shown;
  for (const char* piece : {"42", "<", "/", "ans", "wer", ">", "tail"}) shown += f.push(piece);
  CHECK(shown == "42");
  CHECK(f.stopped());
}

TEST_CASE("no stop strings: everything passes at once", "[stop]") {
  StopStringFilter f({});
  CHECK(f.push("abc") == "abc");
  CHECK(f.flush().empty());
}

TEST_CASE("held text never ends inside a UTF-8 character", "[stop]") {
  StopStringFilter f({"\xc3\xa9t\xc3\xa9"});      // "été"
  const std::string out = f.push("caf\xc3\xa9");  // "café": "é" could start "été"
  CHECK(out == "caf");
  CHECK(f.push("!") == "\xc3\xa9!");
}
