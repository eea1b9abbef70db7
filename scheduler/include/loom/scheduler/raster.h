// loom/scheduler/raster.h: the order in which one node's cluster tiles are
// queued (swizzled groups, for L2 reuse).
//
// The grid has `rows` cluster tiles along M and `cols` along N (ClusterGrid).
//
//   kAlongM: the columns are cut into bands of `group_size` consecutive
//     columns, visited left to right (the last band may be narrower, width w).
//     Inside a band the walk goes down M: row 0 of the band's w columns left to
//     right, then row 1, ... So index i of band b (0 <= i < rows * w) is
//       row = i / w,  col = b * group_size + i % w.
//     The band's w B tiles (weights) stay in L2 while A streams past.
//   kAlongN: the transpose: bands of `group_size` consecutive rows, visited top
//     to bottom; inside a band of height h the walk goes along N:
//       col = i / h,  row = b * group_size + i % h.
//     The band's h A tiles stay in L2 while B streams past.
//
//   loom::sched::ClusterCoord c =
//       loom::sched::RasterizedClusterTile(/*index=*/17, {.rows = 4, .cols = 9},
//                                          loom::sched::RasterOrder::kAlongN, 2);
#ifndef LOOM_SCHEDULER_RASTER_H_
#define LOOM_SCHEDULER_RASTER_H_

#include <cstdint>
#include <vector>

#include "loom/scheduler/schedule.h"
#include "loom/scheduler/tiling.h"

namespace loom::sched {

struct ClusterCoord {
  int32_t row = 0;  // along M
  int32_t col = 0;  // along N
  bool operator==(const ClusterCoord&) const = default;
};

// The cluster tile at position `index` (0 <= index < grid.size()) of the
// rasterization above. O(1). group_size < 1 is treated as 1; a group wider than
// the grid is one band.
ClusterCoord RasterizedClusterTile(int64_t index, const ClusterGrid& grid, RasterOrder order,
                                   int32_t group_size);

// All cluster tiles of the grid in raster order.
std::vector<ClusterCoord> RasterizeClusterTiles(const ClusterGrid& grid, RasterOrder order,
                                                int32_t group_size);

// Walk along the longer dimension: kAlongM when the grid has more rows than
// columns, else kAlongN.
RasterOrder ChooseRaster(const ClusterGrid& grid);

// The band width, in cluster tiles. A wave of W co-resident clusters inside one
// band of width g touches g cross panels and W / g walk panels, which is least
// at g = sqrt(W); g is then capped so the g cross panels (tile extent x K bf16
// each) fit in a slice of L2 (kL2SliceBytes), and to [1, 16] and the band's
// cross dimension. `cross_panel_bytes` is one cross panel's size.
inline constexpr int64_t kL2SliceBytes = int64_t{16} << 20;  // a third of H100/H200's 50 MB L2
int32_t ChooseGroupSize(const ClusterGrid& grid, RasterOrder order, int32_t max_clusters,
                        int64_t cross_panel_bytes);

}  // namespace loom::sched

#endif  // LOOM_SCHEDULER_RASTER_H_
