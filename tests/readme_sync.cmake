# Fails when README.md does not contain examples/minimal.cc verbatim (the README's usage
# example is the file the build compiles and runs, so it cannot rot).
file(READ "${SOURCE_DIR}/README.md" readme)
file(READ "${SOURCE_DIR}/examples/minimal.cc" example)
string(FIND "${readme}" "${example}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not contain examples/minimal.cc verbatim: update the README's usage example")
endif()
