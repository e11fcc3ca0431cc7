// Boost.JSON's compiled part, in its own translation unit (Debian's -all-dev
// does not ship libboost_json; see ../shared/STACK.md).
#include <boost/json/src.hpp>
