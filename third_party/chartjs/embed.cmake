# Writes OUTPUT, a C++ file defining tpcheck::chartjs_source() as the text of INPUT (the
# minified Chart.js), in raw string literals of at most 60000 characters (compilers need
# not accept longer single literals) joined by the preprocessor.
file(READ ${INPUT} js)
string(LENGTH "${js}" n)
set(out "// Generated from ${INPUT} by third_party/chartjs/embed.cmake. Do not edit.\n")
string(APPEND out "#include <string_view>\nnamespace tpcheck {\nstd::string_view chartjs_source() {\n  static const char kText[] =\n")
set(pos 0)
while(pos LESS n)
  string(SUBSTRING "${js}" ${pos} 60000 piece)
  string(APPEND out "R\"tpjs(${piece})tpjs\"\n")
  math(EXPR pos "${pos} + 60000")
endwhile()
string(APPEND out ";\n  return {kText, sizeof(kText) - 1};\n}\n}  // namespace tpcheck\n")
file(WRITE ${OUTPUT} "${out}")
