// What the scheduler needs of a prepared request beyond the public header: the backend's view
// of it, with its images' rows when it has images (engine.cpp holds Prepared::Impl).
#pragma once
#include <clefrt/clefrt.h>

#include "model/batch.h"

namespace clefrt {

model::Sequence sequence_of(const Prepared& p);

}  // namespace clefrt
