#include "services/collectived/process_metrics.h"

#include <dirent.h>
#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace collectived {
namespace {

prometheus::MetricFamily Single(const std::string& name, const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

double OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  double count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory stream's own descriptor
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  // /proc/self/stat: fields after the command (which may hold spaces and parentheses).
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close != std::string::npos) {
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    double utime = 0, stime = 0, threads = 0, start_ticks = 0, vsize = 0, rss_pages = 0;
    for (int i = 3; fields >> field; ++i) {  // field numbers as in proc(5)
      if (i == 14) utime = std::stod(field);
      if (i == 15) stime = std::stod(field);
      if (i == 20) threads = std::stod(field);
      if (i == 22) start_ticks = std::stod(field);
      if (i == 23) vsize = std::stod(field);
      if (i == 24) rss_pages = std::stod(field);
    }
    families.push_back(Single("process_cpu_seconds_total", "User and system CPU time spent",
                              MetricType::Counter, (utime + stime) / ticks));
    families.push_back(Single("process_resident_memory_bytes", "Resident memory size",
                              MetricType::Gauge, rss_pages * page));
    families.push_back(
        Single("process_virtual_memory_bytes", "Virtual memory size", MetricType::Gauge, vsize));
    families.push_back(
        Single("process_threads", "Threads of the process", MetricType::Gauge, threads));
    double boot_time = 0;
    std::ifstream proc_stat("/proc/stat");
    for (std::string line; std::getline(proc_stat, line);) {
      if (line.rfind("btime ", 0) == 0) boot_time = std::stod(line.substr(6));
    }
    families.push_back(Single("process_start_time_seconds",
                              "Start time of the process since the epoch, in seconds",
                              MetricType::Gauge, boot_time + start_ticks / ticks));
  }
  families.push_back(
      Single("process_open_fds", "Open file descriptors", MetricType::Gauge, OpenDescriptors()));
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    families.push_back(Single("process_max_fds", "The most file descriptors it may open",
                              MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  return families;
}

}  // namespace collectived
