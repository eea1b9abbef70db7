// Swizzled rasterization of a node's cluster tiles (see raster.h).
#include "loom/scheduler/raster.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace loom::sched {

ClusterCoord RasterizedClusterTile(int64_t index, const ClusterGrid& grid, RasterOrder order,
                                   int32_t group_size) {
  // Work in (walk, cross) coordinates: walk is the long direction of a band,
  // cross the band's width. kAlongM walks rows (M) across bands of columns.
  const bool along_m = order == RasterOrder::kAlongM;
  const int64_t walk_len = along_m ? grid.rows : grid.cols;
  const int64_t cross_len = along_m ? grid.cols : grid.rows;
  const int64_t group = std::clamp<int64_t>(group_size, 1, std::max<int64_t>(cross_len, 1));
  const int64_t band = index / (walk_len * group);         // every band before the last is full
  const int64_t in_band = index % (walk_len * group);
  const int64_t width = std::min(group, cross_len - band * group);
  const int64_t walk = in_band / width;
  const int64_t cross = band * group + in_band % width;
  return along_m ? ClusterCoord{static_cast<int32_t>(walk), static_cast<int32_t>(cross)}
                 : ClusterCoord{static_cast<int32_t>(cross), static_cast<int32_t>(walk)};
}

std::vector<ClusterCoord> RasterizeClusterTiles(const ClusterGrid& grid, RasterOrder order,
                                                int32_t group_size) {
  std::vector<ClusterCoord> tiles;
  tiles.reserve(static_cast<size_t>(std::max<int64_t>(grid.size(), 0)));
  for (int64_t i = 0; i < grid.size(); ++i) {
    tiles.push_back(RasterizedClusterTile(i, grid, order, group_size));
  }
  return tiles;
}

RasterOrder ChooseRaster(const ClusterGrid& grid) {
  return grid.rows > grid.cols ? RasterOrder::kAlongM : RasterOrder::kAlongN;
}

int32_t ChooseGroupSize(const ClusterGrid& grid, RasterOrder order, int32_t max_clusters,
                        int64_t cross_panel_bytes) {
  const int64_t cross_len = order == RasterOrder::kAlongM ? grid.cols : grid.rows;
  const int64_t wave = std::max<int64_t>(1, std::min<int64_t>(max_clusters, grid.size()));
  int64_t group = std::llround(std::sqrt(static_cast<double>(wave)));
  if (cross_panel_bytes > 0) group = std::min(group, kL2SliceBytes / cross_panel_bytes);
  group = std::min<int64_t>(group, 16);
  group = std::min(group, cross_len);
  return static_cast<int32_t>(std::max<int64_t>(group, 1));
}

}  // namespace loom::sched
