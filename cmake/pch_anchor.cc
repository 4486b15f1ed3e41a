// The one source of the precompiled-header targets (cmake/PrecompiledHeaders.cmake): CMake
// builds a target's precompiled headers alongside its sources, and an object library needs one.
