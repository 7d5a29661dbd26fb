#pragma once
/// \file
/// Prometheus text exposition (format 0.0.4) for /metrics: histograms, and a writer that emits each
/// metric family's HELP and TYPE once with one sample per label set. Names follow vLLM's (`vllm:` →
/// `infer:`), so dashboards built for vLLM need only the prefix changed:
///
///   infer:num_requests_running / _waiting         gauges, per engine
///   infer:kv_cache_usage_perc                     gauge, used blocks / total blocks (0..1)
///   infer:prefix_cache_queries_total / _hits_total counters, in tokens; infer:prefix_cache_hit_rate gauge
///   infer:prompt_tokens_total / generation_tokens_total counters
///   infer:time_to_first_token_seconds, inter_token_latency_seconds, e2e_request_latency_seconds histograms
///   infer:request_success_total{finished_reason}  counter;  infer:requests_rejected_total{reason} counter
///
/// Values are written by the engine thread and read by the /metrics handler, so each histogram carries
/// its own mutex; one observation is a few additions under it.

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace infer::serve {

/// A cumulative histogram with fixed upper bounds (seconds for the latency histograms).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

  void observe(double v) {
    std::lock_guard lock(mu_);
    std::size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    counts_[i]++;
    sum_ += v;
    count_++;
  }

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<std::uint64_t> cumulative;  ///< per bound, then +Inf
    double sum = 0;
    std::uint64_t count = 0;
  };
  [[nodiscard]] Snapshot snapshot() const {
    std::lock_guard lock(mu_);
    Snapshot s{bounds_, {}, sum_, count_};
    std::uint64_t run = 0;
    for (auto c : counts_) s.cumulative.push_back(run += c);
    return s;
  }

  /// vLLM's buckets for time to first token and end-to-end latency, and for inter-token latency.
  static std::vector<double> ttft_buckets() {
    return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
  }
  static std::vector<double> itl_buckets() {
    return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
  }
  static std::vector<double> e2e_buckets() {
    return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0};
  }

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

/// A set of counters keyed by one label value (finish reasons, rejection reasons, routes).
class LabeledCounter {
 public:
  void add(const std::string& label, std::uint64_t n = 1) {
    std::lock_guard lock(mu_);
    values_[label] += n;
  }
  [[nodiscard]] std::map<std::string, std::uint64_t> snapshot() const {
    std::lock_guard lock(mu_);
    return values_;
  }
  [[nodiscard]] std::uint64_t get(const std::string& label) const {
    std::lock_guard lock(mu_);
    auto it = values_.find(label);
    return it == values_.end() ? 0 : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::uint64_t> values_;
};

using Labels = std::vector<std::pair<std::string, std::string>>;

/// Collects samples by family and writes them in the text format, HELP/TYPE once per family.
class PrometheusWriter {
 public:
  void gauge(const std::string& name, const std::string& help, const Labels& labels, double v) {
    sample(name, "gauge", help, name, labels, v);
  }
  void counter(const std::string& name, const std::string& help, const Labels& labels, double v) {
    sample(name, "counter", help, name, labels, v);
  }
  void histogram(const std::string& name, const std::string& help, const Labels& labels, const Histogram::Snapshot& h) {
    for (std::size_t i = 0; i <= h.bounds.size(); ++i) {
      Labels l = labels;
      l.emplace_back("le", i < h.bounds.size() ? number(h.bounds[i]) : std::string("+Inf"));
      sample(name, "histogram", help, name + "_bucket", l, static_cast<double>(h.cumulative[i]));
    }
    sample(name, "histogram", help, name + "_sum", labels, h.sum);
    sample(name, "histogram", help, name + "_count", labels, static_cast<double>(h.count));
  }

  [[nodiscard]] std::string str() const {
    std::ostringstream os;
    for (const auto& name : order_) {
      const Family& f = families_.at(name);
      os << "# HELP " << name << ' ' << f.help << "\n# TYPE " << name << ' ' << f.type << '\n';
      for (const auto& line : f.lines) os << line << '\n';
    }
    return os.str();
  }

  static std::string number(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    std::ostringstream os;
    os.precision(17);
    os << v;
    return os.str();
  }
  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '\\') out += "\\\\";
      else if (c == '"') out += "\\\"";
      else if (c == '\n') out += "\\n";
      else out += c;
    }
    return out;
  }

 private:
  struct Family {
    std::string type, help;
    std::vector<std::string> lines;
  };
  void sample(const std::string& family, const char* type, const std::string& help, const std::string& name,
              const Labels& labels, double v) {
    auto [it, fresh] = families_.try_emplace(family);
    if (fresh) {
      it->second.type = type;
      it->second.help = help;
      order_.push_back(family);
    }
    std::string line = name;
    if (!labels.empty()) {
      line += '{';
      for (std::size_t i = 0; i < labels.size(); ++i) {
        if (i) line += ',';
        line += labels[i].first + "=\"" + escape(labels[i].second) + '"';
      }
      line += '}';
    }
    line += ' ' + number(v);
    it->second.lines.push_back(std::move(line));
  }
  std::map<std::string, Family> families_;
  std::vector<std::string> order_;
};

/// What one engine's requests measured (the engine thread writes, /metrics reads).
struct RequestMetricsSet {
  Histogram ttft{Histogram::ttft_buckets()};
  Histogram itl{Histogram::itl_buckets()};
  Histogram e2e{Histogram::e2e_buckets()};
  LabeledCounter finished;  ///< by finish reason: stop, length, abort, error
  LabeledCounter rejected;  ///< by reason: queue_full, invalid, shutting_down, loading
};

}  // namespace infer::serve
