// Prints DeepGEMM's own hashes of the inputs key_vectors.py gives it, computed by deep_jit's hash.hpp and
// parser.hpp as shipped in the sdist (compiled with the shims beside this file):
//   digest FILE                          the 128-bit digest of FILE's bytes
//   source INCLUDE_DIR FILE              Parser({INCLUDE_DIR}, {"deep_gemm/"}).parse_into_hash(FILE's bytes)
//   key SIGNATURE VERSION_FILE FLAGS_FILE SOURCE_DIGEST
//                                        the cache key as Runtime::cache_key chains it (no post hook)
#include <deep_jit/utils/hash.hpp>
#include <deep_jit/utils/parser.hpp>

#include <fstream>
#include <iostream>
#include <iterator>

static std::string read(const char* path) {
    std::ifstream input(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(input), std::istreambuf_iterator<char>()};
}

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "digest" and argc == 3) {
        std::cout << deep_jit::hash::get_hex_digest(read(argv[2])) << "\n";
    } else if (mode == "source" and argc == 4) {
        deep_jit::Parser parser({argv[2]}, {"deep_gemm/"});
        std::cout << parser.parse_into_hash(read(argv[3])) << "\n";
    } else if (mode == "key" and argc == 6) {
        deep_jit::hash::FNV1a hash;
        hash.update(argv[2]);
        hash.update(deep_jit::hash::get_hex_digest(read(argv[3])));
        hash.update(read(argv[4]));
        hash.update("");
        std::cout << hash.update(argv[5]).get_hex_digest() << "\n";
    } else {
        std::cerr << "usage: digest FILE | source INCLUDE_DIR FILE | key SIGNATURE VERSION_FILE FLAGS_FILE SOURCE_DIGEST\n";
        return 2;
    }
    return 0;
}
