# Fails when a file in gguf/, text/, model/ or engine/ includes CAF, Asio/Beast or CUDA
# headers, when gguf/ or text/ include the model core (net/ links text without the forward
# pass), when engine/ (the step loop) includes threads or I/O, or when worker/ (which a
# node process runs without the actors) includes CAF or Asio. No room below the actors
# includes the Engine facade (troupe/engine.hpp, implemented in actors/): its values are in
# troupe/config.hpp, events.hpp and stats.hpp.
set(bad "")
function(forbid room pattern)
  file(GLOB_RECURSE files "${ROOT}/${room}/*.hpp" "${ROOT}/${room}/*.cpp")
  foreach(f ${files})
    file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](${pattern})")
    if(lines)
      list(APPEND bad "${f}: ${lines}")
    endif()
  endforeach()
  set(bad "${bad}" PARENT_SCOPE)
endfunction()
set(facade "troupe/engine.hpp")
forbid(gguf "caf/|boost/asio|boost/beast|cuda|cublas|nccl|model/|text/|${facade}")
forbid(text "caf/|boost/asio|boost/beast|cuda|cublas|nccl|model/|${facade}")
forbid(grammar "${facade}")
forbid(model "caf/|boost/asio|boost/beast|cuda|cublas|nccl|${facade}")
forbid(cpu "${facade}")
forbid(gpu "${facade}")
forbid(engine "caf/|boost/asio|boost/beast|cuda|cublas|nccl|thread>|mutex>|future>|fstream>|iostream>|${facade}")
forbid(worker "caf/|boost/asio|boost/beast|${facade}")
forbid(monitoring "${facade}")
if(bad)
  message(FATAL_ERROR "forbidden includes:\n${bad}")
endif()
message(STATUS "gguf/, text/, model/ and engine/ include no CAF, Asio or CUDA headers; gguf/ and text/ nothing of model/ (gguf/ nothing of text/); engine/ no threads or I/O; worker/ no CAF or Asio; no room below actors/ the Engine facade")
