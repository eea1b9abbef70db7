// What a tile job reads and publishes (see job_access.h).
#include "loom/scheduler/job_access.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace loom::sched {

ElementBox OperandRegion(const NodeSchedule& node, const TileShape& tile, DependencyOperand operand,
                         CtaTile cta, int32_t k_block_begin, int32_t k_block_end) {
  // Whole tiles and k-blocks, not clipped to the operand's extent: the
  // kernels wait for these (see job_access.h).
  const int64_t rows_begin = int64_t{cta.m_block} * tile.m;
  const int64_t rows_end = rows_begin + tile.m;
  const int64_t k_begin = int64_t{k_block_begin} * tile.k;
  const int64_t k_end = int64_t{k_block_end} * tile.k;
  switch (operand) {
    case DependencyOperand::kA:
      return ElementBox{rows_begin, rows_end, k_begin, k_end};
    case DependencyOperand::kB: {
      const int64_t n_begin = int64_t{cta.n_block} * tile.n;
      return ElementBox{n_begin, n_begin + tile.n, k_begin, k_end};
    }
    case DependencyOperand::kBias: {
      const int64_t n_begin = int64_t{cta.n_block} * tile.n;
      return ElementBox{0, 1, n_begin, n_begin + tile.n};
    }
    case DependencyOperand::kResidual: {
      const int64_t c_begin = int64_t{cta.n_block} * node.out_tile_n;
      return ElementBox{rows_begin, rows_end, c_begin, c_begin + node.out_tile_n};
    }
  }
  return ElementBox{};
}

TileBox ClippedProducerTiles(const NodeSchedule& producer, const TileShape& tile,
                             const DependencyEdge& edge, const ElementBox& region) {
  if (region.row_begin >= region.row_end || region.col_begin >= region.col_end) return TileBox{};
  TileBox box = ProducerTiles(producer, tile, edge, region.row_begin, region.row_end,
                              region.col_begin, region.col_end);
  box.m_begin = std::max(box.m_begin, 0);
  box.n_begin = std::max(box.n_begin, 0);
  box.m_end = std::min(box.m_end, producer.m_blocks);
  box.n_end = std::min(box.n_end, producer.n_blocks);
  if (box.empty()) return TileBox{};
  return box;
}

bool CtaTileInRange(const NodeSchedule& node, CtaTile cta) {
  return cta.m_block >= 0 && cta.m_block < node.m_blocks && cta.n_block >= 0 &&
         cta.n_block < node.n_blocks;
}

namespace {

bool OperandInPhase(DependencyOperand operand, ReadPhase phase) {
  switch (phase) {
    case ReadPhase::kMainLoop:
      return operand == DependencyOperand::kA || operand == DependencyOperand::kB;
    case ReadPhase::kEpilogue:
      return operand == DependencyOperand::kBias || operand == DependencyOperand::kResidual;
    case ReadPhase::kPartials:
      return false;
  }
  return false;
}

bool PhaseApplies(const NodeSchedule& node, const TileJob& job, ReadPhase phase) {
  const bool is_reduce = job.kind == static_cast<uint8_t>(JobKind::kReduce);
  switch (phase) {
    case ReadPhase::kMainLoop: return !is_reduce;
    case ReadPhase::kPartials: return PartialsSummed(node, job) > 0;
    case ReadPhase::kEpilogue: return true;  // kGemm jobs wait for them (a split one too), kReduce jobs read them
  }
  return false;
}

}  // namespace

void AppendJobReadBoxes(const Schedule& schedule, const TileJob& job, int32_t k_block_begin,
                        int32_t k_block_end, ReadPhase phase, std::vector<ProducerBox>* boxes) {
  const NodeSchedule& node = schedule.nodes[job.node];
  if (phase == ReadPhase::kPartials || !PhaseApplies(node, job, phase)) return;
  for (int rank = 0; rank < schedule.cluster_size; ++rank) {
    // A cluster's CTA whose tile lies past the node still waits, as the
    // tiled kernel's loader does (its region may hold producer tiles where
    // the operand is a slice of a larger output).
    const CtaTile cta = CtaTileOf(job, node.share, rank);
    for (int32_t e = 0; e < node.dependency_count; ++e) {
      const DependencyEdge& edge = schedule.dependencies[node.dependency_begin + e];
      const auto operand = static_cast<DependencyOperand>(edge.operand);
      if (!OperandInPhase(operand, phase)) continue;
      const NodeSchedule& producer = schedule.nodes[edge.producer];
      const ElementBox region =
          OperandRegion(node, schedule.tile, operand, cta, k_block_begin, k_block_end);
      const TileBox box = ClippedProducerTiles(producer, schedule.tile, edge, region);
      if (!box.empty()) boxes->push_back(ProducerBox{edge.producer, box});
    }
  }
}

void AppendJobReads(const Schedule& schedule, const TileJob& job, int32_t k_block_begin,
                    int32_t k_block_end, ReadPhase phase, std::vector<FlagRead>* reads) {
  const NodeSchedule& node = schedule.nodes[job.node];
  if (!PhaseApplies(node, job, phase)) return;
  if (phase == ReadPhase::kPartials) {
    const int32_t summed = PartialsSummed(node, job);
    for (int rank = 0; rank < schedule.cluster_size; ++rank) {
      const CtaTile cta = CtaTileOf(job, node.share, rank);
      if (!CtaTileInRange(node, cta)) continue;
      for (int32_t s = 0; s < summed; ++s) {
        reads->push_back(FlagRead{PartialFlagIndex(node, cta.m_block, cta.n_block, s), job.node, cta.m_block,
                                  cta.n_block, s});
      }
    }
    return;
  }
  std::vector<ProducerBox> boxes;
  AppendJobReadBoxes(schedule, job, k_block_begin, k_block_end, phase, &boxes);
  for (const ProducerBox& pb : boxes) {
    const NodeSchedule& producer = schedule.nodes[pb.producer];
    for (int32_t mb = pb.box.m_begin; mb < pb.box.m_end; ++mb) {
      for (int32_t nb = pb.box.n_begin; nb < pb.box.n_end; ++nb) {
        reads->push_back(FlagRead{OutputFlagIndex(producer, mb, nb), pb.producer, mb, nb, -1});
      }
    }
  }
}

void AppendJobWrites(const Schedule& schedule, const TileJob& job, std::vector<FlagWrite>* writes) {
  const NodeSchedule& node = schedule.nodes[job.node];
  const bool epilogue = JobRunsEpilogue(node, job);
  for (int rank = 0; rank < schedule.cluster_size; ++rank) {
    const CtaTile cta = CtaTileOf(job, node.share, rank);
    if (!CtaTileInRange(node, cta)) continue;
    if (epilogue) {
      const bool in_parts = job.kind == static_cast<uint8_t>(JobKind::kReduce) && node.reduce_parts > 1;
      writes->push_back(FlagWrite{OutputFlagIndex(node, cta.m_block, cta.n_block), cta.m_block, cta.n_block,
                                  -1, in_parts ? job.split : 0, in_parts ? node.reduce_parts : 1});
    } else {
      writes->push_back(FlagWrite{PartialFlagIndex(node, cta.m_block, cta.n_block, job.split), cta.m_block,
                                  cta.n_block, job.split});
    }
  }
}

void AppendEveryJobRead(const Schedule& schedule, const TileJob& job, std::vector<FlagRead>* reads) {
  AppendJobReads(schedule, job, job.k_block_begin, job.k_block_end, ReadPhase::kMainLoop, reads);
  AppendJobReads(schedule, job, 0, 0, ReadPhase::kPartials, reads);
  AppendJobReads(schedule, job, 0, 0, ReadPhase::kEpilogue, reads);
}

}  // namespace loom::sched
