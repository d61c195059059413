# Fails when README.md does not contain each example verbatim (the README's usage examples are
# the files the build compiles and runs, so they cannot rot).
file(READ "${SOURCE_DIR}/README.md" readme)
foreach(name minimal backward layer step)
  file(READ "${SOURCE_DIR}/examples/${name}.cc" example)
  string(FIND "${readme}" "${example}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "README.md does not contain examples/${name}.cc verbatim: update the README's example")
  endif()
endforeach()
