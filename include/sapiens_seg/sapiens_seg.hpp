// Umbrella header of libsapiens_seg. LibTorch and OpenCV stay out of it: programs that only
// segment images compile against these few headers.
#pragma once

#include "sapiens_seg/cards.hpp"
#include "sapiens_seg/error.hpp"
#include "sapiens_seg/log.hpp"
#include "sapiens_seg/model.hpp"
#include "sapiens_seg/names.hpp"
#include "sapiens_seg/options.hpp"
#include "sapiens_seg/settings.hpp"
#include "sapiens_seg/weights.hpp"
