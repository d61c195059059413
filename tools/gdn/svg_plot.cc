// svg_plot.cc: see svg_plot.h.
#include "svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace gdn::cli::svg {

namespace {

constexpr double kPanelWidth = 440, kPlotLeft = 70, kPlotTop = 30, kPlotWidth = 340,
                 kPlotHeight = 230, kLegendRow = 15, kTitleHeight = 40;
// Ten strong colours, then ten darker ones: a suite plot has up to 13 series labels (float32
// and bf16 rows), which the first ten alone would repeat.
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
                                "#0b3c5d", "#a14d00", "#145a14", "#7a1414", "#4b2c6b",
                                "#4a2d26", "#8e3c7a", "#3d3d3d", "#6b6b0f", "#0d6e78"};

std::string fmt(const char* format, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, a);
  return buf;
}

// "%.1f" with coordinates rounded to 0.1 px.
std::string px(double v) { return fmt("%.1f", v); }

const char* color_of(const Series& s, std::size_t index) {
  const std::size_t n = sizeof kPalette / sizeof kPalette[0];
  return kPalette[(s.color >= 0 ? static_cast<std::size_t>(s.color) : index) % n];
}

// A tick label: 1, 10, 1k, 64k, 1M; 0.1, 0.01 below 1.
std::string tick_label(double v) {
  if (v >= 1e6) return fmt("%gM", v / 1e6);
  if (v >= 1e3) return fmt("%gk", v / 1e3);
  return fmt("%g", v);
}

std::string text(double x, double y, const std::string& s, const char* anchor = "middle",
                 int size = 11, const char* extra = "") {
  return "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + std::to_string(size) +
         "\" text-anchor=\"" + anchor + "\"" + extra + ">" + escape(s) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const char* stroke,
                 const char* extra = "") {
  return "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) +
         "\" stroke=\"" + stroke + "\"" + extra + "/>\n";
}

// The panel's frame, title and axis labels (in panel coordinates).
std::string frame(const Panel& p) {
  std::string out;
  out += "<rect x=\"" + px(kPlotLeft) + "\" y=\"" + px(kPlotTop) + "\" width=\"" + px(kPlotWidth) +
         "\" height=\"" + px(kPlotHeight) + "\" fill=\"none\" stroke=\"#333\"/>\n";
  out += text(kPlotLeft + kPlotWidth / 2, 18, p.title, "middle", 13, " font-weight=\"bold\"");
  out += text(kPlotLeft + kPlotWidth / 2, kPlotTop + kPlotHeight + 34, p.x_label);
  const double cy = kPlotTop + kPlotHeight / 2;
  out += text(16, cy, p.y_label, "middle", 11,
              (" transform=\"rotate(-90 16 " + px(cy) + ")\"").c_str());
  return out;
}

// Legend rows under the plot, two columns.
std::string legend(const Panel& p, bool lines) {
  std::string out;
  const double top = kPlotTop + kPlotHeight + 50;
  for (std::size_t i = 0; i < p.series.size(); ++i) {
    const Series& s = p.series[i];
    const double x = kPlotLeft - 50 + (i % 2) * 200.0, y = top + (i / 2) * kLegendRow;
    if (lines) {
      out +=
          line(x, y - 4, x + 22, y - 4, color_of(s, i),
               s.dashed ? " stroke-width=\"2\" stroke-dasharray=\"5,3\"" : " stroke-width=\"2\"");
    } else {
      out += "<rect x=\"" + px(x + 5) + "\" y=\"" + px(y - 10) +
             "\" width=\"12\" height=\"10\" fill=\"" + color_of(s, i) + "\"/>\n";
    }
    out += text(x + 28, y, s.name, "start", 10);
  }
  return out;
}

std::string log_lines(const Panel& p) {
  double lo_x = HUGE_VAL, hi_x = -HUGE_VAL, lo_y = HUGE_VAL, hi_y = -HUGE_VAL;
  auto usable = [](double x, double y) { return x > 0 && y > 0 && std::isfinite(x * y); };
  for (const Series& s : p.series) {
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!usable(s.x[i], s.y[i])) continue;
      lo_x = std::min(lo_x, s.x[i]);
      hi_x = std::max(hi_x, s.x[i]);
      lo_y = std::min(lo_y, s.y[i]);
      hi_y = std::max(hi_y, s.y[i]);
    }
  }
  if (!(lo_x <= hi_x)) lo_x = 1, hi_x = 10, lo_y = 1, hi_y = 10;
  // Whole decades around the data.
  const double x0 = std::floor(std::log10(lo_x)),
               x1 = std::max(x0 + 1, std::ceil(std::log10(hi_x)));
  const double y0 = std::floor(std::log10(lo_y)),
               y1 = std::max(y0 + 1, std::ceil(std::log10(hi_y)));
  auto sx = [&](double x) { return kPlotLeft + (std::log10(x) - x0) / (x1 - x0) * kPlotWidth; };
  auto sy = [&](double y) {
    return kPlotTop + kPlotHeight - (std::log10(y) - y0) / (y1 - y0) * kPlotHeight;
  };
  std::string out = frame(p);
  const int x_step = static_cast<int>(std::ceil((x1 - x0) / 6)),
            y_step = static_cast<int>(std::ceil((y1 - y0) / 6));
  for (double e = x0; e <= x1; e += x_step) {
    const double x = sx(std::pow(10, e));
    out += line(x, kPlotTop, x, kPlotTop + kPlotHeight, "#ddd");
    out += text(x, kPlotTop + kPlotHeight + 15, tick_label(std::pow(10, e)));
  }
  for (double e = y0; e <= y1; e += y_step) {
    const double y = sy(std::pow(10, e));
    out += line(kPlotLeft, y, kPlotLeft + kPlotWidth, y, "#ddd");
    out += text(kPlotLeft - 5, y + 4, tick_label(std::pow(10, e)), "end");
  }
  for (std::size_t k = 0; k < p.series.size(); ++k) {
    const Series& s = p.series[k];
    std::string points, marks;
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!usable(s.x[i], s.y[i])) continue;
      const std::string xy = px(sx(s.x[i])) + "," + px(sy(s.y[i]));
      points += (points.empty() ? "" : " ") + xy;
      marks += "<circle cx=\"" + px(sx(s.x[i])) + "\" cy=\"" + px(sy(s.y[i])) +
               "\" r=\"2.5\" fill=\"" + color_of(s, k) + "\"/>\n";
    }
    if (points.empty()) continue;
    out += "<polyline fill=\"none\" stroke=\"" + std::string(color_of(s, k)) +
           "\" stroke-width=\"1.5\"" + (s.dashed ? " stroke-dasharray=\"5,3\"" : "") +
           " points=\"" + points + "\"><title>" + escape(s.name) + "</title></polyline>\n" + marks;
  }
  return out + legend(p, true);
}

std::string bars(const Panel& p) {
  double hi = 0;
  for (const Series& s : p.series) {
    for (double v : s.y) {
      if (std::isfinite(v)) hi = std::max(hi, v);
    }
  }
  // A step of 1, 2 or 5 x 10^n giving at most 6 intervals.
  const double raw = (hi > 0 ? hi : 1) / 5;
  const double unit = std::pow(10, std::floor(std::log10(raw)));
  const double step = raw <= unit       ? unit
                      : raw <= 2 * unit ? 2 * unit
                      : raw <= 5 * unit ? 5 * unit
                                        : 10 * unit;
  const double top = std::ceil((hi > 0 ? hi : 1) / step) * step;
  auto sy = [&](double v) { return kPlotTop + kPlotHeight - v / top * kPlotHeight; };
  std::string out = frame(p);
  for (double v = 0; v <= top * (1 + 1e-9); v += step) {
    out += line(kPlotLeft, sy(v), kPlotLeft + kPlotWidth, sy(v), "#ddd");
    out += text(kPlotLeft - 5, sy(v) + 4, fmt("%g", v), "end");
  }
  const std::size_t groups = std::max<std::size_t>(p.categories.size(), 1);
  const double group_width = kPlotWidth / static_cast<double>(groups);
  const double bar_width =
      group_width * 0.8 / static_cast<double>(std::max<std::size_t>(p.series.size(), 1));
  // Category labels at 10 px, smaller (down to 7) when the longest would not fit its group
  // (a character is about 0.6 of the font size wide).
  std::size_t longest = 1;
  for (const std::string& c : p.categories) longest = std::max(longest, c.size());
  const int label_size =
      std::clamp(static_cast<int>(group_width / (0.62 * static_cast<double>(longest))), 7, 10);
  for (std::size_t g = 0; g < p.categories.size(); ++g) {
    const double left = kPlotLeft + g * group_width + group_width * 0.1;
    out += text(kPlotLeft + (g + 0.5) * group_width, kPlotTop + kPlotHeight + 15, p.categories[g],
                "middle", label_size);
    for (std::size_t k = 0; k < p.series.size(); ++k) {
      const Series& s = p.series[k];
      if (g >= s.y.size() || !std::isfinite(s.y[g]) || s.y[g] <= 0) continue;
      const double y = sy(std::min(s.y[g], top));
      out += "<rect x=\"" + px(left + k * bar_width) + "\" y=\"" + px(y) + "\" width=\"" +
             px(bar_width * 0.9) + "\" height=\"" + px(kPlotTop + kPlotHeight - y) + "\" fill=\"" +
             color_of(s, k) + "\"><title>" + escape(s.name + " " + p.categories[g]) + ": " +
             fmt("%.4g", s.y[g]) + "</title></rect>\n";
    }
  }
  return out + legend(p, false);
}

}  // namespace

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render(const std::string& title, const std::vector<Panel>& panels) {
  std::size_t rows = 0;
  for (const Panel& p : panels) rows = std::max(rows, (p.series.size() + 1) / 2);
  const double panel_height = kPlotTop + kPlotHeight + 50 + rows * kLegendRow + 10;
  const double width = std::max<double>(1, panels.size()) * kPanelWidth + 20;
  const double height = kTitleHeight + panel_height;
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) +
                    "\" height=\"" + px(height) + "\" viewBox=\"0 0 " + px(width) + " " +
                    px(height) + "\" font-family=\"sans-serif\">\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += text(width / 2, 24, title, "middle", 15, " font-weight=\"bold\"");
  for (std::size_t i = 0; i < panels.size(); ++i) {
    out +=
        "<g transform=\"translate(" + px(10 + i * kPanelWidth) + " " + px(kTitleHeight) + ")\">\n";
    out += panels[i].kind == Panel::Kind::log_lines ? log_lines(panels[i]) : bars(panels[i]);
    out += "</g>\n";
  }
  return out + "</svg>\n";
}

}  // namespace gdn::cli::svg
