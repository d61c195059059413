# MODE=install: a fresh `cmake --install BUILD_DIR --prefix PREFIX` (the fixture of the others).
# Otherwise: builds the README's example (examples/minimal.cc) against an installed gdn, as a
# project outside gdn's tree does, and runs it. MODE=cmake: the consumer/ project with
# find_package(gdn CONFIG); MODE=pkg-config: the compiler called with what `pkg-config
# --cflags --libs gdn` says. Neither sees gdn's source or build tree, only PREFIX.
# Arguments: MODE, PREFIX (the installed tree), LIBDIR (its lib directory, relative), EXAMPLE,
# CONSUMER_DIR, WORK (scratch), GENERATOR, CXX.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  set(output "${out}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "install")
  # Fresh: a file an earlier install left behind must not stand in for one this one misses.
  file(REMOVE_RECURSE "${PREFIX}")
  run("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${PREFIX}")
  return()
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
if(MODE STREQUAL "cmake")
  run("configuring the consumer" ${CMAKE_COMMAND} -S "${CONSUMER_DIR}" -B "${WORK}" -G "${GENERATOR}"
      "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_PREFIX_PATH=${PREFIX}"
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF "-DGDN_EXAMPLE=${EXAMPLE}")
  string(FIND "${output}" "from ${PREFIX}/" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the consumer did not find gdn's package under ${PREFIX}:\n${output}")
  endif()
  run("building the consumer" ${CMAKE_COMMAND} --build "${WORK}")
elseif(MODE STREQUAL "pkg-config")
  # Only the installed tree's .pc files: a gdn.pc elsewhere on the system cannot answer.
  set(ENV{PKG_CONFIG_LIBDIR} "${PREFIX}/${LIBDIR}/pkgconfig")
  run("pkg-config --cflags --libs gdn" pkg-config --cflags --libs gdn)
  string(STRIP "${output}" flags)
  string(FIND "${flags}" "-I${PREFIX}/" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "gdn.pc does not point into ${PREFIX}: '${flags}'")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run("compiling the consumer with gdn.pc's flags" "${CXX}" -std=c++17 "${EXAMPLE}" ${flags}
      -o "${WORK}/consumer")
else()
  message(FATAL_ERROR "consume.cmake: MODE must be install, cmake or pkg-config; given '${MODE}'")
endif()
run("running the consumer" "${WORK}/consumer")
if(NOT output MATCHES "reference o\\[0, 0, 0\\] = ")
  message(FATAL_ERROR "the consumer ran but printed something else:\n${output}")
endif()
message(STATUS "${output}")
