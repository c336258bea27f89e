// The GPU's energy counter, SM clock, power draw and clock-event reasons through NVML
// (libnvidia-ml.so.1, opened at run time: the driver ships it, so nothing links against it).
// Under the model a Hopper card runs at its power cap, well below its boost clock, while short
// labs and anchors do not (bench/results/2026-12-06-h100-session36.md): `clefrt bench` reports
// each point's energy and clock beside its time.
#pragma once
#include <string>

namespace clefrt::cuda {

struct PowerReading {
  bool available = false;
  std::string why;             // what NVML lacked, when not available
  double energy_j = 0;         // since the driver loaded (nvmlDeviceGetTotalEnergyConsumption)
  double sm_clock_mhz = 0;     // now
  double power_w = 0;          // now (nvmlDeviceGetPowerUsage)
  bool power_capped = false;   // the clock held down for power now (clock-event reason: software power cap)
};
// The current CUDA device's reading (its NVML handle found by PCI bus id once).
PowerReading read_power();

}  // namespace clefrt::cuda
