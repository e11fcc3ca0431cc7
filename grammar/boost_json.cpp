// Boost.JSON's compiled part, in its own translation unit (Debian's -all-dev
// does not ship libboost_json; see ../shared/STACK.md). The one definition for the whole
// program lives here (troupe_grammar_json), in the lowest room that parses JSON (schemas);
// net/ links it.
#include <boost/json/src.hpp>
