// svg_plot.h: a small SVG figure writer (no dependencies) for the benchmark suite's plot:
// panels side by side under one title, each a log-log line chart or a grouped bar chart, with
// axis labels and a legend.
#pragma once

#include <string>
#include <vector>

namespace gdn::cli::svg {

// A line (x, y points; non-positive or non-finite points are left out on log axes) or, in a
// bar panel, one bar per category (y only).
struct Series {
  std::string name;
  std::vector<double> x, y;
  int color = -1;       // index into the palette; -1: the series' position
  bool dashed = false;  // lines only
};

struct Panel {
  enum class Kind { log_lines, bars };
  Kind kind = Kind::log_lines;
  std::string title, x_label, y_label;
  std::vector<std::string> categories;  // bars: the groups along x
  std::vector<Series> series;
};

// The whole figure: `title` (escaped here) above the panels. Always a well-formed document,
// also for empty panels.
std::string render(const std::string& title, const std::vector<Panel>& panels);

// Text escaped for SVG/XML (& < > ").
std::string escape(const std::string& text);

}  // namespace gdn::cli::svg
